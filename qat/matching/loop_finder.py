"""Finding a graph's recurrent loops: loops whose body computes a layer.

Two forms carry them: a functional `While` op whose body is a function of
the library (`qat.matching.loops`), and a TF1 loop's frame of graph ops
(`qat.matching.frames`). `recurrent_loops(graph)` gives both as
`qat.matching.loops.Loop`s, the form `qat.prepare.loops` unrolls.
"""
from typing import Dict, List, Optional

import tensorflow as tf
from tensorflow.core.framework import function_pb2

from qat.engine import function_library
from qat.engine import marks
from qat.engine import op_index
from qat.matching import frames
from qat.matching import loops


def recurrent_loops(graph: tf.Graph,
                    library: Optional[Dict[str, function_pb2.FunctionDef]] = None
                    ) -> List[loops.Loop]:
    """The loops of `graph` whose body computes a layer, not unrolled yet.

    Args:
      graph: the graph to search (not modified).
      library: its function library (`function_library.library_of(graph)`,
        read when None).

    Returns:
      The While ops' loops in graph order, then the TF1 loops
      (`qat.matching.frames.frame_loops`).
    """
    library = function_library.library_of(graph) if library is None else library
    return [loops.loop_of(op, library)
            for op in op_index.ops_of_types(graph, function_library.LOOP_TYPES)
            if not marks.is_replaced(op)
            and loops.body_layers(op, library)] + frames.frame_loops(graph)
