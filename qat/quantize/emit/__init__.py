"""Building the quantize pass from a plan: quantizers and range updates, one checked rewrite.

  insert_quant_ops      -> `emit_quantizers`: every quantizer a plan
                           (`qat.quantize.plan.plan_quantizers`) asks for,
                           their consumers rerouted, as one
                           `qat.engine.rewrite.Rewrite`
  quantizer_spec        -> what one quantizer is (`QuantizerSpec`), validated
  quantizer_batch       -> range variables + FakeQuant, built in batches
  range_updates         -> the ranges' moving averages and last values
  fake_quant_gradient   -> the training graph's registered gradients
  standalone_batch_norm -> an eval graph's batch norm after no layer, as a
                           quantized 1x1 depthwise conv
  quant_ops             -> contrib's one-at-a-time functions
"""
