"""Graph normalisations every later pass relies on, run before the fold.

Each rewrites forms the passes cannot reach into the forms they recognise,
in training and eval graphs alike, and leaves what it replaced unconnected
and marked (`qat.engine.marks.is_replaced`), so a second call changes nothing:

  layer_norm       -> tf_keras's fused layer norm as the arithmetic an
                      integer model can run
  resource_gathers -> a resource variable's lookup (`ResourceGather`) as a
                      variable read + GatherV2, so the table can get a range
  layer_calls      -> a function call computing one layer (tf_keras's
                      grouped Conv2D) as that layer op
  constant_fills   -> zeros_like(x) / ones_like(x) as a Fill of x's shape
                      (TFLite's FILL is integer, ZEROS_LIKE is not)

and, first of all (it refuses a loop it cannot unroll before anything else
changes),

  loops            -> a recurrent layer's loop (Keras LSTM / GRU /
                      SimpleRNN, dynamic_rnn; While ops and TF1 frames)
                      unrolled, its tensor lists as lists of tensors
                      (`tensor_lists`)

`prepare_graph` runs them in this order (what `create_training_graph` and its
siblings run before the fold); `qat.fold_batch_norms` and
`qat.insert_quant_ops` run `layer_calls` alone, as they always did.
"""
import tensorflow as tf

from qat.prepare import constant_fills
from qat.prepare import layer_calls
from qat.prepare import layer_norm
from qat.prepare import loops
from qat.prepare import resource_gathers


def prepare_graph(graph: tf.Graph) -> None:
    """Runs every normalisation on `graph`, in place, in pipeline order."""
    # First: it refuses a loop it cannot unroll before anything is changed,
    # and the other passes then see the steps' ops.
    loops.unroll_loops(graph)
    layer_norm.unfuse_layer_norms(graph)
    resource_gathers.split_resource_gathers(graph)
    layer_calls.inline_layer_calls(graph)
    constant_fills.fill_constant_likes(graph)
