"""The ranges of embedding tables.

Each embedding table (`qat.quantize.plan.model.lookups.lookup_table`) gets one
per-tensor weight range, `<table variable>/weights_quant`, which every lookup
of it reads: TFLite's GATHER gives its output the table's scale, so the
gathered embeddings need no range of their own (`RangeReader.source` maps
a lookup's output to its table). Not per channel: a scale per embedding
column would make the gathered activations per-channel quantized, which no
TFLite kernel after a GATHER reads.

Where the data path leaves integers otherwise (a cast of an integer input,
a lookup with batch dimensions), the op is named in `left_float`.
"""
from qat.quantize.plan.model import graph as plan_graph
from qat.quantize.plan.model import lookups
from qat.quantize.plan.ranges import book as book_lib

_CAST_REASON = (
    "Cast of the integer input %s to float: an attention mask's arithmetic "
    "((1 - mask) * -10000 added to the scores) spans 10^4, and one 8-bit "
    "range over the scores it is added to would leave them a step of about "
    "40: the mask's arithmetic and the attention reading it stay float")
_GATHER_REASON = ("%s with batch dimensions reads its table inside the op: "
                  "no quantizer can reach the table")


def plan_embeddings(view: plan_graph.GraphView, book: book_lib.PlanBook,
                    settings: book_lib.PlanSettings) -> None:
    """Plans the table ranges; names what stays float on the way in.

    Args:
      view: the graph's `GraphView` (its entries: lookups and casts).
      book: the `PlanBook` the ranges are planned into.
      settings: the pass's `PlanSettings` (its scope).
    """
    order = lambda entry: entry[0]._id  # pylint: disable=protected-access,unnecessary-lambda-assignment
    for op, table in sorted(view.entries.items(), key=order):
        if not settings.in_scope(op):
            book.leave(op.name, settings.outside_reason(op))
            continue
        if table is None:
            if op not in view.model:
                continue  # Loss arithmetic (a cast of the labels).
            if op.type == "Cast":
                book.leave(op.name, _CAST_REASON % op.inputs[0].name)
            else:
                book.leave(op.name, _GATHER_REASON % op.type)
            continue
        plan = book.plans.get(table)
        if plan is not None:  # Tied: a layer's weights too.
            if plan.per_channel:
                book.leave(op.name, "its table %s is quantized per channel as a "
                           "layer's weights; GATHER needs one scale" % table.name)
            elif op not in plan.consumers:
                plan.consumers.append(op)
            continue
        if book.plan(table, lookups.table_name(table), "weights_quant", -6.0,
                     view.consumers(table), is_weight=True) and settings.precisions is not None:
            precision = settings.precisions.of(op)
            if precision is not None:
                book.plans[table].bits = precision.weight_bits
