"""Building the quantize pass from a plan: quantizers and range updates, one checked rewrite.

  insert_quant_ops      -> `emit_quantizers`: every quantizer a plan
                           (`qat.quantize.plan.plan_quantizers`) asks for,
                           their consumers rerouted, as one
                           `qat.engine.rewrite.Rewrite`
  quantizer_spec        -> what one quantizer is (`QuantizerSpec`), validated
  quantizer_batch       -> range variables + FakeQuant, built in batches
  node_writer           -> the NodeDefs, shared constants and range variables
                           a batch and its collaborators write, on explicit
                           devices
  range_scopes          -> range variables named after a recurrence's first step
  range_updates         -> the ranges' moving averages and last values
  range_floors          -> TFLite kernel preconditions as floors on learnt ranges
  finite_ranges         -> no NaN or infinite batch enters a range; the
                           skipped-batch counters
  step_statistics       -> replicas' range statistics combined once per step
  statistics_packs      -> the packed vector of a step's statistics, and
                           where it joins
  fake_quant_gradient   -> the training graph's registered gradients
  xla_gradients         -> their forms under XLA
  standalone_batch_norm -> an eval graph's batch norm after no layer, as a
                           quantized 1x1 depthwise conv
  quant_ops             -> contrib's one-at-a-time functions
"""
