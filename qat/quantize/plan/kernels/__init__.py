"""Which kernel needs what: TFLite's preconditions on the scales of a kernel.

  kernel_preconditions -> TFLite's kernel preconditions on scales, as data
  kernel_requirements  -> where each applies: the ranges it constrains and
                          reads, on the plan owning the constrained range
  layer_bias           -> a layer's int32 bias as the converter computes it,
                          as tensors of the graph

Reads the model (`qat.quantize.plan.model`) and the ops
(`qat.quantize.plan.ops`); a planner's plans are handed in after its run.
"""
