"""The fold pass: batch norms folded into the layer before them.

`plan` validates a batch norm against its layer without changing the graph;
`fold_batch_norms` builds and wires the folded structure.
"""
