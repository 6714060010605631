"""Deciding the quantize pass, no op created: which tensors get a range, named how.

Four questions, each a sub-package; none asks another in a loop (ops <- model
<- ranges and kernels; the planner drives them all):

  ops/        -> what the ops mean: TFLite's integer op table, the op forms
                 the rules recognise, the ops the converter removes
  model/      -> what the model is: the graph view (`GraphView`), sources,
                 lookups, layer tails, observers, the model/loss boundary,
                 the layout found once (`ModelLayout`), recurrences, layers
                 inside control flow
  ranges/     -> which tensor gets a range, named how: the plans (`Plan`,
                 `PlanBook`), the range a tensor reads, the rules, fixed
                 grids, roundings, shared ranges
  kernels/    -> which kernel needs what: TFLite's kernel preconditions on
                 scales, where each applies, a layer's int32 bias
  planner     -> `Planner` (visits the data path in graph order and hands
                 each op to its rule), `plan_quantizers` (a graph's plans)
  replication -> the hook `qat.distribute` fills (replicas share ranges)
"""
from qat.quantize.plan.model.graph import existing_quantizer
from qat.quantize.plan.model.graph import is_quantized_output
from qat.quantize.plan.planner import Plan
from qat.quantize.plan.planner import PlannedGraph
from qat.quantize.plan.planner import Planner
from qat.quantize.plan.planner import check_recipe
from qat.quantize.plan.planner import plan_quantizers

__all__ = ["Plan", "PlannedGraph", "Planner", "check_recipe", "existing_quantizer", "is_quantized_output",
           "plan_quantizers"]
