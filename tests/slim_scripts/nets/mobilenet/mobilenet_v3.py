"""MobileNet v3 layer specs, as research/slim's nets/mobilenet/mobilenet_v3.py has them.

Only the part that runs on import matters here: the detection variants are
derived from the classification specs with `np.int(np.round(...))`, NumPy's
alias that NumPy 1.24 removed.
"""
import copy

import numpy as np

V3_SMALL = dict(spec=[dict(num_outputs=n) for n in
                      (16, 24, 24, 40, 40, 40, 48, 48, 96, 96, 96, 576, 1024)])


def _reduce_consecutive_layers(conv_defs, start_id, end_id, multiplier=0.5):
  """Reduce the outputs of consecutive layers with multiplier."""
  defs = copy.deepcopy(conv_defs)
  for d in defs['spec'][start_id:end_id+1]:
    d.update({
        'num_outputs': np.int(np.round(d['num_outputs'] * multiplier))
    })
  return defs


V3_SMALL_DETECTION = _reduce_consecutive_layers(V3_SMALL, 9, 12)
