"""Which tensor gets a range, named how: the rules, and the plans they write.

  book          -> `Plan`, `PlanBook` (the plans, their names, what stays
                   float), `PlanSettings`
  reader        -> `RangeReader`: the range a tensor reads (back through
                   same-scale ops, dropout, lookups)
  rules         -> `RangeRules`: layers, ops with a range of their own, the
                   tensors they read
  entries       -> where the range of a tensor entering the model is named
  structures    -> `StructureRules`: whole activations, constant divisions,
                   standalone batch norms
  weights       -> layers' weight ranges
  embeddings    -> embedding tables' ranges
  fixed_ranges  -> TFLite's fixed output grids (LOGISTIC, TANH, SOFTMAX)
  roundings     -> average pools and bilinear resizes round to their input's
                   range
  shared_ranges -> one range for a concatenation's group, a recurrence's
                   steps, identical ops
  precisions    -> `LayerPrecisions`: each layer's precision under a recipe
                   (its bits, per channel, float)

Reads the model (`qat.quantize.plan.model`) and the ops
(`qat.quantize.plan.ops`); the planner (`qat.quantize.plan.planner`) drives it.
"""
