"""The quantize pass: FakeQuant ops on weights and activations.

`patterns` and `plan` decide which tensors get a range, `quantizer_batch`
builds the quantizers, `insert_quant_ops` is the pass; `quant_ops` keeps
contrib's one-at-a-time functions, `fake_quant_gradient` the training
gradient, `standalone_batch_norm` the eval-graph lowering of batch norms that
follow no layer.
"""
