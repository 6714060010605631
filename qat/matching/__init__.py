"""Recognising layers and batch norms by graph structure.

`matcher` is the pattern language; `layer_patterns` declares the layers and
batch norms once, as data, for both passes; `batch_norm` reads a matched batch
norm's parameters and moving-average updates.
"""
