"""qat.graph_editor: the tf.contrib.graph_editor API on live TensorFlow 2 graphs.

Use it as `from qat import graph_editor as ge`, like contrib's
`tf.contrib.graph_editor`: `ge.reroute_ts`, `ge.sgv`, `ge.make_view`, ... and
the submodules `ge.util`, `ge.select`, `ge.subgraph`, `ge.reroute`,
`ge.edit`, `ge.transform`.
"""
# pylint: disable=wildcard-import
from qat.graph_editor import edit
from qat.graph_editor import reroute
from qat.graph_editor import select
from qat.graph_editor import subgraph
from qat.graph_editor import util
from qat.graph_editor.edit import *
from qat.graph_editor.reroute import *
from qat.graph_editor.select import *
from qat.graph_editor.subgraph import *
from qat.graph_editor.util import *

# --- transform (Transformer, copy, graph_replace, ...): added by the
# --- transform engineer below this line.
from qat.graph_editor import transform
from qat.graph_editor.transform import *

# --- end of transform.

# Aliases contrib had.
ph = util.make_placeholder_from_dtype_and_shape
sgv = subgraph.make_view
sgv_scope = subgraph.make_view_from_scope
