"""Training batches a range skipped because their values were not finite.

A range update whose batch min or max is NaN or infinite keeps the range as
it was and counts the batch in the range's `<prefix>/skipped_batches`
(`qat.quantize.emit.finite_ranges`). The count lives in training graphs and
their checkpoints; nothing in the training step logs it (a print op per
range would not compile under XLA, and would print at every step). The
readers here (the coverage report, the TensorBoard summaries) read the counts
of a graph or checkpoint; they and a quantized TF 2 model's
`skipped_batches()` (which its eager training calls, `fit` and
`inference_function` run) warn once per range and process, naming the range
and the tensor it quantizes, with `qat.quantize.emit.finite_ranges.warn`,
beside the counter it reports.
"""
from typing import Dict, Optional

import tensorflow as tf

from qat.quantize.emit import finite_ranges
from qat.tflite import graph_structure as structure

def counts_in_graph(graph: tf.Graph, sess: Optional[tf.compat.v1.Session] = None,
                    reader=None, ranges=None) -> Dict[str, int]:
    """The skipped-batch counts of a graph's ranges.

    Args:
      graph: a rewritten graph (training graphs have the counters; eval
        graphs read them from `reader`).
      sess: a session on `graph` to read its counters with.
      reader: a `tf.train.load_checkpoint` reader, used when there is no
        session: the counters of the checkpoint's ranges.
      ranges: the range names to look up in `reader`.

    Returns:
      {range name: count} of the counters found.
    """
    counts: Dict[str, int] = {}
    if sess is not None:
        counters = graph.get_collection(finite_ranges.SKIPPED_BATCHES_COLLECTION)
        if counters:
            # The variables' own reads: no update runs, no op is added.
            reads = {counter.op.name.rsplit("/", 1)[0]: structure.plain_read(counter.op)
                     for counter in counters}
            counts = {name: int(v) for name, v in
                      sess.run({k: r for k, r in reads.items() if r is not None}).items()}
    elif reader is not None:
        known = reader.get_variable_to_shape_map()
        for name in ranges or ():
            counter = finite_ranges.counter_name(name)
            if counter in known:
                counts[name] = int(reader.get_tensor(counter))
    return counts


def read_skipped_batches(sess: Optional[tf.compat.v1.Session] = None,
                         checkpoint: Optional[str] = None) -> Dict[str, int]:
    """Each range's count of training batches it skipped (their min or max was
    NaN or infinite); warns once per range and process for a count above 0.

    A graph-path training loop can call it with its session every so often;
    the coverage report and a quantized TF 2 model's `skipped_batches()` do the
    same for their ranges.

    Args:
      sess: a session on a rewritten training graph (its counters, the
        collection `qat_skipped_batches`).
      checkpoint: a checkpoint prefix of such a graph, read when there is no
        session.

    Returns:
      {range name (`<prefix>` of `<prefix>/min`): skipped batches}; empty when
      neither holds counters (an eval graph's session).

    Raises:
      ValueError: neither `sess` nor `checkpoint` is given.
    """
    if sess is not None:
        tensors = {}
        for op in structure.fake_quant_ops(sess.graph):
            q = structure.quantizer_op(op)
            if q.min_variable and q.min_variable.rsplit("/", 1)[0] == q.name:
                tensors[q.name] = op.inputs[0].name  # The range's own quantizer.
        counts = counts_in_graph(sess.graph, sess=sess)
    elif checkpoint is not None:
        reader = tf.train.load_checkpoint(checkpoint)
        known = reader.get_variable_to_shape_map()
        ranges = [name[:-len("/min")] for name in known if name.endswith("/min")]
        counts, tensors = counts_in_graph(None, reader=reader, ranges=ranges), {}
    else:
        raise ValueError("read_skipped_batches needs a session or a checkpoint.")
    finite_ranges.warn(counts, tensors)
    return counts
