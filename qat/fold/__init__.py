"""The fold pass: batch norms folded into the layer before them.

`plan` validates a batch norm against its layer without changing the graph;
`emit` describes the new ops as NodeDefs, `wire` connects them (and the
freeze delay); `fold_batch_norms` is the pass (`fold_graph`), run by
`qat.api` (`qat.fold_batch_norms`) on a graph `qat.prepare` normalised.
"""
