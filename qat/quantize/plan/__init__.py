"""Deciding the quantize pass, no op created: which tensors get a range, named how.

  planner            -> `Plan`, `Planner` (the driver: visits the data path in
                        graph order), `plan_quantizers` (a graph's plans)
  rules, entries     -> the range rules; where an entering tensor's range is
                        named
  structures, weights, embeddings
                     -> the planner's other mixins: multi-op activations,
                        dropout, standalone batch norms; weights; tables
  graph              -> what the planner reads off a graph (`GraphView`)
  op_table           -> TFLite's integer op requirements, as data
  patterns, activation_patterns, dropout_patterns, clamps
                     -> op types and forms the rules recognise (dropout_patterns:
                        dropout and drop path, looked through)
  converter_rewrites -> ops the TFLite converter removes
  shared_ranges, fixed_ranges
                     -> one range for a concatenation's group; TFLite's
                        fixed output grids
  lookups            -> token-id models: embedding lookups, integer casts
  feeds              -> model sources: where the model's data enters, by structure
  boundary           -> the model/loss boundary every rule respects
  observers          -> summaries, prints, asserts, metric updates: no model outputs
  control_flow       -> layers inside functional control flow, named
  replication        -> the hook `qat.distribute` fills (replicas share ranges)
"""
from qat.quantize.plan.model.graph import existing_quantizer
from qat.quantize.plan.model.graph import is_quantized_output
from qat.quantize.plan.planner import Plan
from qat.quantize.plan.planner import PlannedGraph
from qat.quantize.plan.planner import Planner
from qat.quantize.plan.planner import plan_quantizers

__all__ = ["Plan", "PlannedGraph", "Planner", "existing_quantizer", "is_quantized_output",
           "plan_quantizers"]
