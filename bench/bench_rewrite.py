"""Times the qat rewrite: Keras models and generated networks of growing size.

(1) create_training_graph on the tf_keras applications of the zoo test
    (tests/zoo_test.py): MobileNet, MobileNetV2, MobileNetV3Small/Large,
    ResNet50, ResNet50V2, InceptionV3, DenseNet121, EfficientNetB0,
    weights=None, graph mode (target: <= 0.3 s each); a second fresh graph
    is rewritten step by step to split the time into fold_batch_norms and
    insert_quant_ops. Beside each time: the ops the rewrite adds, and how
    long TensorFlow alone takes to add those ops to a graph (C++ import and
    Python op objects, as qat's engine adds them; no analysis): the floor
    of any rewrite that builds them as graph ops. The zoo's hand-built
    blocks have a few dozen ops and are not timed.
(2) The same rewrite on generated networks of about 3k, 30k and 300k ops
    (residual blocks conv -> batch norm -> ReLU6 -> conv -> batch norm -> add
    -> ReLU, resource variables, training mode, replicated from one template
    block through a GraphDef import, so building them is cheap). Prints the
    time per op of the original graph for each size (flat means linear),
    the memory (the process's RSS with the network built, and how far above
    it the rewrite took the peak RSS) and the floor as in (1).
(3) With --compare_with=<another checkout>, each Keras model is also
    rewritten by that checkout's qat (a subprocess right after this one's
    run of the same model), and the ratio of the two create times printed.

Before each timed call the garbage of the graphs built earlier in the run is
collected (gc.collect(), untimed): otherwise a full collection of those
graphs (~0.3 s with a few Keras graphs alive) lands in a random timing.

  .venv/bin/python bench/bench_rewrite.py
  .venv/bin/python bench/bench_rewrite.py --models= --sizes=3000,30000
  git worktree add /tmp/qat-before <commit>
  .venv/bin/python bench/bench_rewrite.py --sizes= --compare_with=/tmp/qat-before
"""
import gc
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
# Input sizes: the rewrite time depends on the op count, not on the size.
_SIZES = {"mobilenet": 96, "mobilenet_v2": 96, "mobilenet_v3_small": 96,
          "mobilenet_v3_large": 96, "resnet50": 64, "resnet50_v2": 64,
          "inception_v3": 75, "densenet121": 64, "efficientnet_b0": 64}
_CONSTRUCTORS = {"mobilenet": "MobileNet", "mobilenet_v2": "MobileNetV2",
                 "mobilenet_v3_small": "MobileNetV3Small",
                 "mobilenet_v3_large": "MobileNetV3Large",
                 "resnet50": "ResNet50", "resnet50_v2": "ResNet50V2",
                 "inception_v3": "InceptionV3", "densenet121": "DenseNet121",
                 "efficientnet_b0": "EfficientNetB0"}
flags.DEFINE_list("models", list(_SIZES),
                  "Keras models: " + ", ".join(
                      "%s (%dx%d)" % (k, v, v) for k, v in _SIZES.items()))
flags.DEFINE_integer("repeats", 3, "Fresh Keras graphs rewritten per model "
                     "(median reported).")
flags.DEFINE_list("sizes", ["3000", "30000", "300000"],
                  "Approximate op counts of the generated networks.")
flags.DEFINE_string("compare_with", "",
                    "Another checkout of qat (a directory holding its `qat` "
                    "package, e.g. a git worktree of an older commit): each "
                    "Keras model is also rewritten by it, in a subprocess run "
                    "right after this one's, and both times are printed with "
                    "their ratio.")
flags.DEFINE_bool("json", False, "Print the Keras rows as JSON only (used by "
                  "--compare_with).")

def _keras_graph(name):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    constructor = getattr(tf_keras.applications, _CONSTRUCTORS[name])
    g = tf.Graph()
    with g.as_default():
        tf_keras.backend.set_learning_phase(1)
        size = _SIZES[name]
        x = tf.compat.v1.placeholder(tf.float32, [None, size, size, 3],
                                     name="input")
        # keras.Input(tensor=x): MobileNetV3 refuses a plain tensor.
        constructor(input_tensor=tf_keras.Input(tensor=x), weights=None)
    return g


def _timed(fn):
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _add_floor(original_def, rewritten_def):
    """Seconds TensorFlow itself needs to add the rewrite's new ops.

    Both GraphDefs are imported into empty graphs the way qat's engine
    imports a batch (C++ import, then one Python `Operation` per op, no
    analysis at all); the difference is the cost of the new ops alone, a
    floor for any rewrite that adds them as graph ops.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from qat.engine import graph_import  # pylint: disable=g-import-not-at-top

    def load(graph_def):
        serialized = graph_def.SerializeToString()
        g = tf.Graph()
        return _timed(lambda: graph_import.import_nodes(g, graph_def, serialized, {}, []))

    return load(rewritten_def) - load(original_def)


def _keras_row(name):
    """(ops, median create, fold and quantize times, new ops, median floor)."""
    import qat  # pylint: disable=g-import-not-at-top
    totals, folds, quants, floors = [], [], [], []
    for i in range(FLAGS.repeats):
        logging.info("%s: rewrite %d/%d", name, i + 1, FLAGS.repeats)
        g = _keras_graph(name)
        ops = len(g.get_operations())
        original = None if FLAGS.json else g.as_graph_def()
        totals.append(_timed(lambda: qat.create_training_graph(g)))
        new_ops = len(g.get_operations()) - ops
        if not FLAGS.json:  # --compare_with's checkout may predate the engine.
            floors.append(_add_floor(original, g.as_graph_def()))
        g = _keras_graph(name)
        with g.as_default():
            folds.append(_timed(
                lambda: qat.fold_batch_norms(g, is_training=True)))
            quants.append(_timed(
                lambda: qat.insert_quant_ops(g, is_training=True)))
    return (ops, statistics.median(totals), statistics.median(folds),
            statistics.median(quants), new_ops,
            statistics.median(floors) if floors else None)


def _other_checkout_row(name):
    """`_keras_row(name)` with the qat of --compare_with, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(FLAGS.compare_with))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--json", "--sizes=",
         "--models=" + name, "--repeats=%d" % FLAGS.repeats],
        env=env, check=True, capture_output=True, text=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1])[name])


def _bench_keras():
    rows = []
    for name in FLAGS.models:
        row = _keras_row(name)
        other = _other_checkout_row(name) if FLAGS.compare_with else None
        rows.append((name, row, other))
    if FLAGS.json:
        print(json.dumps({name: row for name, row, _ in rows}))
        return
    print("%-19s %8s %12s %10s %12s %8s %8s %12s" % (
        "model", "ops", "create_s", "fold_s", "quantize_s", "<=0.3s",
        "new_ops", "add_floor_s")
          + ("  %14s %8s" % ("other create_s", "ratio") if FLAGS.compare_with else ""))
    for name, (ops, total, fold, quant, new_ops, floor), other in rows:
        print("%-19s %8d %12.3f %10.3f %12.3f %8s %8d %12.3f" % (
            name, ops, total, fold, quant, "yes" if total <= 0.3 else "no",
            new_ops, floor)
              + ("  %14.3f %8.2f" % (other[1], total / other[1]) if other else ""))
    print("new_ops: ops the training rewrite adds; add_floor_s: the time "
          "TensorFlow's C++ import and Python op objects alone take to add "
          "them to a graph (no analysis)")
    if FLAGS.compare_with:
        print("ratio: create_s / create_s of %s (below 1: this checkout is faster)"
              % FLAGS.compare_with)


def _rss_mb(field):
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _reset_peak_rss():
    """Makes VmHWM start again from the current RSS (Linux clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        logging.warning("cannot reset the peak RSS: peak_added_MB counts from "
                        "the process's earlier peak")


def _template():
    """GraphDef of one residual block reading the placeholder 'block_input'."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.variable_scope("", use_resource=True):
        x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 8],
                                     name="block_input")
        h = x
        for i in range(2):
            h = tf.compat.v1.layers.conv2d(h, 8, 3, padding="same",
                                           use_bias=False, name="conv%d" % i)
            h = tf.compat.v1.layers.batch_normalization(h, training=True,
                                                        name="bn%d" % i)
            if i == 0:
                h = tf.nn.relu6(h)
        out = tf.nn.relu(h + x, name="block_output")
    return g.as_graph_def(), out.op.name


def _generated_graph(target_ops):
    """A chain of template blocks with about `target_ops` ops."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    template, out_name = _template()
    nodes = [n for n in template.node if n.name != "block_input"]
    blocks = max(1, round(target_ops / len(nodes)))
    gdef = tf.compat.v1.GraphDef()
    gdef.node.add().CopyFrom(
        [n for n in template.node if n.name == "block_input"][0])
    gdef.node[0].name = "input"
    previous = "input"
    for b in range(blocks):
        prefix = "block%d/" % b

        def rename(ref, prefix=prefix, previous=previous):
            control = ref.startswith("^")
            name = ref[1:] if control else ref
            base, _, port = name.partition(":")
            base = previous if base == "block_input" else prefix + base
            name = base + (":" + port if port else "")
            return ("^" if control else "") + name

        for node in nodes:
            new = gdef.node.add()
            new.CopyFrom(node)
            new.name = prefix + node.name
            del new.input[:]
            new.input.extend(rename(i) for i in node.input)
            if "shared_name" in new.attr and new.attr["shared_name"].s:
                new.attr["shared_name"].s = (prefix.encode() +
                                             new.attr["shared_name"].s)
            if "_class" in new.attr:
                classes = [c.replace(b"loc:@", b"loc:@" + prefix.encode())
                           for c in new.attr["_class"].list.s]
                del new.attr["_class"].list.s[:]
                new.attr["_class"].list.s.extend(classes)
        previous = prefix + out_name
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gdef, name="")
    return g, blocks


def _bench_generated():
    import qat  # pylint: disable=g-import-not-at-top
    rows = []
    for size in FLAGS.sizes:
        target = int(size)
        logging.info("generating a network of about %d ops", target)
        g, blocks = _generated_graph(target)
        ops = len(g.get_operations())
        original = g.as_graph_def()
        logging.info("%d ops (%d blocks): folding", ops, blocks)
        gc.collect()
        graph_mb = _rss_mb("VmRSS")
        _reset_peak_rss()
        with g.as_default():
            fold = _timed(lambda: qat.fold_batch_norms(g, is_training=True))
            logging.info("folded in %.2f s: inserting quant ops", fold)
            quant = _timed(lambda: qat.insert_quant_ops(g, is_training=True))
        added_mb = _rss_mb("VmHWM") - graph_mb
        fakes = sum(1 for op in g.get_operations()
                    if op.type == "FakeQuantWithMinMaxVars")
        logging.info("quantized in %.2f s (%d FakeQuant ops)", quant, fakes)
        new_ops = len(g.get_operations()) - ops
        floor = _add_floor(original, g.as_graph_def())
        rows.append((ops, blocks, fakes, fold, quant, graph_mb, added_mb, new_ops, floor))
        del g, original
    print("%9s %7s %9s %9s %11s %9s %14s %16s %10s %12s %8s %12s" % (
        "ops", "blocks", "fakequant", "fold_s", "quantize_s", "total_s",
        "fold_us/op", "quantize_us/op", "rss_MB", "peak_added_MB", "new_ops",
        "add_floor_s"))
    for ops, blocks, fakes, fold, quant, graph_mb, added_mb, new_ops, floor in rows:
        print("%9d %7d %9d %9.2f %11.2f %9.2f %14.1f %16.1f %10.0f %12.0f %8d %12.2f" % (
            ops, blocks, fakes, fold, quant, fold + quant, 1e6 * fold / ops,
            1e6 * quant / ops, graph_mb, added_mb, new_ops, floor))
    print("rss_MB: the process with the network built, before the rewrite; "
          "peak_added_MB: its peak during the rewrite above that; add_floor_s: "
          "as for the Keras models")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print("per-op time, largest / smallest network: fold %.2f, quantize "
              "%.2f (1.0 = linear)" % ((last[3] / last[0]) / (first[3] / first[0]),
                                       (last[4] / last[0]) / (first[4] / first[0])))


def main(argv):
    del argv
    for name in FLAGS.models:
        if name not in _SIZES:
            raise app.UsageError("Unknown model %r; choose from %s."
                                 % (name, sorted(_SIZES)))
    if FLAGS.repeats < 1:
        raise app.UsageError("--repeats must be >= 1.")
    if FLAGS.models:
        _bench_keras()
    if FLAGS.sizes:
        _bench_generated()


if __name__ == "__main__":
    app.run(main)
