"""The quantize pass: FakeQuant ops on weights and activations, in two rooms.

  plan/ -> deciding, no op created: which tensors get a range, named how
           (`qat.quantize.plan.Planner`; TFLite's integer op table, the
           converter's rewrites, shared and fixed ranges, lookups)
  emit/ -> creating the quantizers and range updates a plan asks for, as one
           checked rewrite (`qat.quantize.emit.insert_quant_ops`), and
           contrib's one-at-a-time functions (`quant_ops`)

`control_flow` is the old path of `plan/model/control_flow.py`, kept for one
release. `qat.api` wires them (`qat.insert_quant_ops`): the graph's layer calls
inlined (`qat.prepare`), the plan, then the emission, with data-parallel
replicas sharing ranges through `qat.distribute`.
"""
