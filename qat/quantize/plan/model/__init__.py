"""What the model is: facts read off one graph, no range decided.

  graph        -> `GraphView`: layers, gradient ops, the data path, consumers
  feeds        -> model sources: where the model's data enters, by structure
  lookups      -> token-id models: embedding lookups, integer casts
  tails        -> a layer's tail: what TFLite fuses into it
  observers    -> summaries, prints, asserts, metric updates: no model outputs
  boundary     -> the model/loss boundary every rule respects
  layout       -> `ModelLayout`: tails, whole activations, dropout, batch
                  statistics, found once per graph
  recurrences  -> the steps of a recurrent layer, matched
  control_flow -> layers inside functional control flow, named

Reads what the ops mean (`qat.quantize.plan.ops`) and nothing else of the plan.
"""
