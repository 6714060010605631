"""Recognising layers and batch norms by graph structure.

`matcher` is the pattern language; `layer_patterns` declares the layers and
batch norms once, as data, for both passes; `batch_norm` reads a matched batch
norm's parameters and moving-average updates; `standalone_batch_norms` finds
batch norms after no layer; `layer_calls` a function call computing one
layer; `tensors` FakeQuant types, quantizable dtypes and value numbers;
`loops` a While loop's body and functions, `frames` a TF1 loop in the same
form, and `loop_finder` the recurrent loops of a graph in both forms.
"""
