"""Graph editor scaling: walks, reroutes and copies on generated graphs.

Generates tf.compat.v1 graphs of about 10k, 30k and 100k ops (a ladder:
x[i+1] = x[i] + x[i] * c[i % 8], two ops per rung, plus the constants) and
times, on each:
  * a forward walk from the first op (`ge.get_forward_walk_ops`, visits every
    rung) and a backward walk from the last op (`ge.get_backward_walk_ops`);
  * 1,000 reroutes (`ge.reroute_ts`): each makes the consumer of one rung's
    Mul output read the rung's input instead (one input slot each);
  * 1,000 reroutes restricted with `can_modify` (one op each);
  * a copy (`ge.copy_with_input_replacements`) of a 1,000-op slice.

Walk times are reported per visited op, reroutes and copies per call: if the
implementation is linear in what it touches, the per-op and per-call figures
stay flat as the graph grows from 10k to 100k ops. The last lines print the
100k/10k ratios of those figures (about 1.0 means linear).

Usage:
  .venv/bin/python bench/bench_graph_editor.py
  .venv/bin/python bench/bench_graph_editor.py --sizes=10000,100000 --reroutes=1000
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from qat import graph_editor as ge  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["10000", "30000", "100000"], "Approximate graph sizes, in ops.")
flags.DEFINE_integer("reroutes", 1000, "Reroutes per graph.")
flags.DEFINE_integer("copy_ops", 1000, "Ops in the copied slice.")
flags.DEFINE_integer("repeats", 3, "Walk repetitions (the best time is kept).")
flags.DEFINE_integer("seed", 0, "Seed of the reroute positions.")


def build_ladder(n_ops: int):
    """Returns (graph, rung inputs, rung Mul outputs) of a ~n_ops-op ladder."""
    graph = tf.Graph()
    xs, muls = [], []
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4], name="x")
        consts = [tf.constant(1.0 + 0.001 * i, name="c%d" % i) for i in range(8)]
        for i in range((n_ops - 9) // 2):
            xs.append(x)
            m = tf.multiply(x, consts[i % 8], name="m%d" % i)
            muls.append(m)
            x = tf.add(x, m, name="a%d" % i)
        xs.append(x)
    return graph, xs, muls


def best_time(fn, repeats):
    best, result = None, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, result


def bench_size(n_ops: int, rng):
    logging.info("Generating a graph of ~%d ops...", n_ops)
    start = time.perf_counter()
    graph, xs, muls = build_ladder(n_ops)
    build_s = time.perf_counter() - start
    total = len(graph.get_operations())
    first, last = xs[0].op, xs[-1].op
    logging.info("%d ops built in %.1f s; walking...", total, build_s)
    fwd_s, fwd = best_time(lambda: ge.get_forward_walk_ops([first]), FLAGS.repeats)
    bwd_s, bwd = best_time(lambda: ge.get_backward_walk_ops([last]), FLAGS.repeats)

    logging.info("Rerouting...")
    n_rungs = len(muls)
    picks = rng.choice(n_rungs, size=2 * FLAGS.reroutes, replace=False)
    free_picks, restricted_picks = picks[:FLAGS.reroutes], picks[FLAGS.reroutes:]
    changed = 0
    start = time.perf_counter()
    for i in free_picks:
        changed += ge.reroute_ts(xs[i], muls[i])
    reroute_s = time.perf_counter() - start
    restricted = 0
    start = time.perf_counter()
    for i in restricted_picks:
        restricted += ge.reroute_ts(xs[i], muls[i], can_modify=[xs[i + 1].op])
    restricted_s = time.perf_counter() - start
    if changed != FLAGS.reroutes or restricted != FLAGS.reroutes:
        raise RuntimeError("expected {} slot changes per batch, got {} and {}".format(
            FLAGS.reroutes, changed, restricted))

    logging.info("Copying a %d-op slice...", FLAGS.copy_ops)
    lo = n_rungs // 2
    slice_ops = [op for i in range(lo, lo + FLAGS.copy_ops // 2)
                 for op in (muls[i].op, xs[i + 1].op)]
    start = time.perf_counter()
    _, info = ge.copy_with_input_replacements(slice_ops, {}, dst_scope="copy")
    copy_s = time.perf_counter() - start
    if len(info._transformed_ops) != len(slice_ops):  # pylint: disable=protected-access
        raise RuntimeError("copy is incomplete")
    return {
        "ops": total, "build_s": build_s,
        "fwd_s": fwd_s, "fwd_n": len(fwd), "bwd_s": bwd_s, "bwd_n": len(bwd),
        "reroute_s": reroute_s, "restricted_s": restricted_s,
        "copy_s": copy_s, "copy_n": len(slice_ops),
    }


def main(argv):
    del argv
    rng = np.random.RandomState(FLAGS.seed)
    rows = [bench_size(int(size), rng) for size in FLAGS.sizes]
    header = ("{:>8} {:>11} {:>12} {:>12} {:>12} {:>12} {:>14} {:>16} {:>14}".format(
        "ops", "fwd walk s", "fwd us/op", "bwd walk s", "bwd us/op",
        "reroutes s", "us/reroute", "us/can_modify", "copy us/op"))
    print("reroutes per graph: {}, copied slice: {} ops, walks: best of {}".format(
        FLAGS.reroutes, FLAGS.copy_ops, FLAGS.repeats))
    print(header)
    for r in rows:
        print("{:>8} {:>11.3f} {:>12.2f} {:>12.3f} {:>12.2f} {:>12.3f} {:>14.1f} {:>16.1f} {:>14.1f}"
              .format(r["ops"], r["fwd_s"], 1e6 * r["fwd_s"] / r["fwd_n"],
                      r["bwd_s"], 1e6 * r["bwd_s"] / r["bwd_n"], r["reroute_s"],
                      1e6 * r["reroute_s"] / FLAGS.reroutes,
                      1e6 * r["restricted_s"] / FLAGS.reroutes,
                      1e6 * r["copy_s"] / r["copy_n"]))
    small, big = rows[0], rows[-1]
    growth = big["ops"] / small["ops"]

    def ratio(key, per):
        return (big[key] / big[per]) / (small[key] / small[per]) if per else \
            big[key] / small[key]

    print("graph size ratio {}/{} ops = {:.1f}x".format(big["ops"], small["ops"], growth))
    print("per-op forward walk time ratio:  {:.2f}".format(ratio("fwd_s", "fwd_n")))
    print("per-op backward walk time ratio: {:.2f}".format(ratio("bwd_s", "bwd_n")))
    print("per-reroute time ratio:          {:.2f}".format(ratio("reroute_s", None)))
    print("per-reroute (can_modify) ratio:  {:.2f}".format(ratio("restricted_s", None)))
    print("per-op copy time ratio:          {:.2f}".format(ratio("copy_s", "copy_n")))
    print("(about 1.0: linear in what is touched; about {:.0f}: linear in the graph)".format(
        growth))


if __name__ == "__main__":
    app.run(main)
