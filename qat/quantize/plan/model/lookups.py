"""Token-id models: the embedding path from integer inputs to the first layer.

A text model starts from integer ids, not from a float input: the planner's
data path (`qat.quantize.plan.model.graph.GraphView`) also starts at

* embedding lookups: a gather of a float parameter (a variable read or a
  constant, the table) along axis 0 by integer indices (`tf.gather`,
  `tf.nn.embedding_lookup`, tf_keras `Embedding`; position embeddings looked
  up with `tf.range` alike). TFLite's GATHER keeps the table's scale (one
  scale for input and output), so the table gets one per-tensor weight range
  (`<table variable>/weights_quant`) and the gathered embeddings read it: what
  follows (the position add, the first layer norm) then has ranged inputs
  like any other tensor of the model.
* casts of integer model inputs to float (an attention mask's
  `cast(mask) ...`) that reach a layer: on the data path so that what reads
  them is planned, but left float and named (`left_float`): BERT's adder
  `(1 - mask) * -10000` spans 10^4, and one 8-bit range over the scores
  it is added to would leave them a step of about 40.

A resource variable's lookup (`ResourceGather`) is split into a variable read
and a GatherV2 before the passes (`qat.prepare.resource_gathers`); one it
could not split is named in `left_float`.
"""
from typing import Dict, List, Optional

import tensorflow as tf

from qat.engine import marks
from qat.matching import layer_patterns
from qat.matching import tensors
from qat.prepare.resource_gathers import RESOURCE_GATHER_TYPES
from qat.quantize.plan.model import feeds

GATHER_TYPES = frozenset(["GatherV2", "Gather"])


def lookup_table(op: tf.Operation) -> Optional[tf.Tensor]:
    """The table an embedding lookup `op` reads, or None if `op` is none.

    An embedding lookup gathers rows of a float parameter (a variable read or
    a constant) by integer indices.
    """
    if op.type not in GATHER_TYPES or not tensors.is_float(op.outputs[0]):
        return None
    table, indices = op.inputs[0], op.inputs[1]
    if not indices.dtype.is_integer or not tensors.gathers_rows(op):
        return None
    if not _is_parameter(table):
        return None
    return table


def _is_parameter(t: tf.Tensor, depth: int = 6) -> bool:
    """A variable read or constant, maybe behind a quantizer (rewritten or
    frozen graphs: qat's ops, FakeQuant)."""
    frontier = [t]
    for _ in range(depth):
        nxt = []
        for x in frontier:
            if layer_patterns.is_parameter(x):
                return True
            if marks.role(x.op) is not None or x.op.type.startswith("FakeQuantWithMinMax"):
                nxt.extend(i for i in x.op.inputs if tensors.is_float(i))
        frontier = nxt
    return False


def table_name(table: tf.Tensor) -> str:
    """The variable (or constant) a table tensor reads: names its range."""
    op = table.op
    for _ in range(8):
        if op.type not in ("Identity", "ReadVariableOp") or not op.inputs:
            break
        op = op.inputs[0].op
    return op.name


def _is_integer(t: tf.Tensor) -> bool:
    return t.dtype.is_integer or t.dtype.base_dtype == tf.bool


def _from_integer_input(t: tf.Tensor, depth: int = 12) -> bool:
    """Whether integer (or boolean) `t` is computed from an integer model input.

    Back through integer tensors to an op with none: a feed (a placeholder,
    an iterator, a queue's dequeue: an op with no float operand that is not
    a parameter, `qat.quantize.plan.model.feeds`); ids computed from constants or
    shapes (`tf.range`) or from float data (an argmax) are not inputs.
    """
    params = feeds.Parameters()
    frontier = [t]
    for _ in range(depth):
        nxt = []
        for x in frontier:
            integer = [i for i in x.op.inputs if _is_integer(i)]
            if (x.op.type in feeds.FEED_TYPES
                    or (not integer and not params(x)
                        and not any(tensors.is_float(i) for i in x.op.inputs))):
                return True
            nxt.extend(integer)
        frontier = nxt
        if not frontier:
            return False
    return False


def integer_casts(ops: List[tf.Operation]) -> List[tf.Operation]:
    """Casts of integer model inputs (ids, masks; or booleans made of them) to float."""
    return [op for op in ops if op.type == "Cast" and tensors.is_float(op.outputs[0])
            and _is_integer(op.inputs[0]) and _from_integer_input(op.inputs[0])]


def entry_ops(ops: List[tf.Operation]) -> Dict[tf.Operation, Optional[tf.Tensor]]:
    """Where the data path leaves integer tensors: {op: table or None}.

    Embedding lookups map to their table; `ResourceGather` ops that
    `split_resource_gathers` could not split and integer casts map to None.
    """
    found: Dict[tf.Operation, Optional[tf.Tensor]] = {}
    for op in ops:
        table = lookup_table(op)
        if table is not None:
            found[op] = table
        elif (op.type in RESOURCE_GATHER_TYPES and tensors.is_float(op.outputs[0])
              and not marks.is_replaced(op)):
            found[op] = None
    for op in integer_casts(ops):
        found[op] = None
    return found
