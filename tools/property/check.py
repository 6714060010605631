"""Runs the property-based invariants over many random small networks.

    .venv/bin/python tools/property/check.py --examples=10000 --seed=0
    .venv/bin/python tools/property/check.py --suite=converter --examples=1000 --seed=0

Two suites. "rewrite" (the default) checks the rewrites themselves:

Hypothesis draws the networks (tools/property/networks.py: depth 1-6; conv,
depthwise, dense, atrous; bias or not; batch norm fused, unfused or none;
ReLU, ReLU6, LeakyReLU or none; residual adds; concats with the block input
or the network input) from a fixed seed; each is checked against every
invariant of tools/property/invariants.py. A progress line is printed every
--progress_every examples; at the end, the count of violations per invariant
and, for each violated one, the smallest violating network (greedily shrunk
further within --shrink_budget checks). --time_limit_s stops early and says so.
Exit status 1 on any violation, 0 otherwise.

"converter" puts TensorFlow's TFLite converter in the loop
(tools/property/converter_networks.py, tools/property/converter_invariants.py): networks of
spatial sizes down to 1x1 with input pre-processing, pools, global pools,
squeeze-excite blocks, resizes into concatenations, logits and softmax heads
(--grouped: grouped convolutions too) are trained a few steps, restored
into their eval graphs with a strict Saver, converted to uint8 and int8, and
checked for range survival and every layer within one step of TFLite.
"""
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from typing import Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's Conv2D+BiasAdd+Add+LeakyRelu fusion drops alpha (a TensorFlow bug,
# docs/known_limits.md): the exactness invariant needs it off. The converter
# suite has no LeakyReLU and trains grouped convolutions, whose gradients only
# oneDNN computes on CPUs: it keeps it on. (Read before TensorFlow is imported.)
_CONVERTER = "--suite=converter" in sys.argv
# TensorFlow's own default turns oneDNN on only on CPUs with AVX-512: set it either way.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _CONVERTER else "0"

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
import hypothesis  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# The checkout's root (tools/property/ is two levels below it): `tools.property` imports.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.property import families as families_lib  # pylint: disable=g-import-not-at-top

SUITES = ("rewrite", "converter")

FLAGS = flags.FLAGS
flags.DEFINE_integer("examples", 10000, "Random networks to check.")
flags.DEFINE_integer("seed", 0, "Hypothesis seed (the run is reproducible).")
flags.DEFINE_enum("suite", "rewrite", SUITES,
                  "rewrite: qat's rewrites alone; converter: through TFLite's converter.")
flags.DEFINE_bool("grouped", False, "converter suite: draw grouped convolutions too.")
flags.DEFINE_list("families", [],
                  "Draw from these families of the suite only (default: all; "
                  "tools/property/families.py: networks, training, recurrent).")
flags.DEFINE_bool("recurrent", False, "Draw recurrent networks only (--families=recurrent).")
flags.DEFINE_integer("max_depth", None,
                     "Most blocks per network (default: 6 rewrite, 4 converter).")
flags.DEFINE_integer("progress_every", 100, "Print a progress line every N examples.")
flags.DEFINE_integer("shrink_budget", 40,
                     "Checks spent shrinking each violated invariant's example.")
flags.DEFINE_float("time_limit_s", 0.0, "Stop after this many seconds (0: none).")
flags.DEFINE_string("violations_log", None,
                    "Append one JSON line per violating network (repr and messages) to this file.")
flags.DEFINE_integer("workers", 1,
                     "Processes sharing the examples (worker i draws from seed "
                     "--seed * 1000 + i); for machines with more cores.")


class _TimeUp(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Suite:
    """What a run draws and checks."""
    invariants: tuple    # The invariant names, in report order.
    strategy: object     # max_depth -> hypothesis strategy of networks.
    violations: object   # network -> {invariant: message} of the violated ones.
    shrink: object       # (network, still_fails, budget) -> smaller network.
    max_depth: int       # Default depth.


def make_suite(name: str, grouped: bool = False, families: Sequence[str] = ()) -> Suite:
    """The suite called `name` (see SUITES), drawing from its `families`
    (tools/property/families.py; all when empty)."""
    combined = families_lib.combine(name, grouped, families)
    return Suite(combined.invariants, combined.strategy, combined.violations, combined.shrink,
                 4 if name == "converter" else 6)


class _Tally(object):
    """Counts per invariant and the smallest violating network of each."""

    def __init__(self, names):
        self.examples = 0
        self.failing_examples = 0
        self.kinds = {}  # example type name -> examples
        self.counts = {name: 0 for name in names}
        self.smallest = {}  # name -> (network, message)

    def merge(self, other: "_Tally") -> None:
        self.examples += other.examples
        self.failing_examples += other.failing_examples
        for kind, count in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + count
        for name, count in other.counts.items():
            self.counts[name] += count
        for name, (net, message) in other.smallest.items():
            if name not in self.smallest or net.size() < self.smallest[name][0].size():
                self.smallest[name] = (net, message)

    def record(self, net, violated) -> None:
        self.examples += 1
        kind = type(net).__name__
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if violated:
            self.failing_examples += 1
        for name, message in violated.items():
            self.counts[name] += 1
            if name not in self.smallest or net.size() < self.smallest[name][0].size():
                self.smallest[name] = (net, message)


def _worker(args) -> _Tally:
    """One worker process of --workers (spawned: its own TensorFlow)."""
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    logging.set_verbosity(logging.ERROR)
    *args, suite_name, grouped, families, log = args
    return run(*args, suite=make_suite(suite_name, grouped, families), violations_log=log)


def run_parallel(workers: int, num_examples: int, seed: int, max_depth: int,
                 progress_every: int, time_limit_s: float, suite_name: str = "rewrite",
                 grouped: bool = False, violations_log: str = None,
                 families: Sequence[str] = ()) -> _Tally:
    """`run` split over `workers` processes with seeds seed * 1000 + i."""
    counts = [num_examples // workers + (i < num_examples % workers)
              for i in range(workers)]
    jobs = [(n, seed * 1000 + i, max_depth, progress_every, time_limit_s, f"worker {i}: ",
             suite_name, grouped, tuple(families), violations_log)
            for i, n in enumerate(counts) if n]
    tally = _Tally(make_suite(suite_name, grouped, families).invariants)
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        for part in pool.map(_worker, jobs):
            tally.merge(part)
    return tally


def run(num_examples: int, seed: int, max_depth: int, progress_every: int,
        time_limit_s: float, label: str = "", suite: Suite = None,
        violations_log: str = None) -> _Tally:
    """Checks `num_examples` networks drawn from `seed`; returns the tally."""
    suite = suite or make_suite("rewrite")
    tally = _Tally(suite.invariants)
    start = time.time()

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=num_examples, database=None, deadline=None,
                         phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(suite.strategy(max_depth))
    def check(net):
        if time_limit_s and time.time() - start > time_limit_s:
            raise _TimeUp()
        violated = suite.violations(net)
        tally.record(net, violated)
        if violated and violations_log:
            with open(violations_log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"network": repr(net), "violations": violated}) + "\n")
        if tally.examples % progress_every == 0:
            elapsed = time.time() - start
            print(f"{label}{tally.examples}/{num_examples} examples, "
                  f"{tally.failing_examples} with violations, {elapsed:.0f} s "
                  f"({elapsed / tally.examples:.2f} s/example)", flush=True)

    try:
        check()  # pylint: disable=no-value-for-parameter
    except _TimeUp:
        print(f"{label}time limit of {time_limit_s:.0f} s reached after "
              f"{tally.examples} examples", flush=True)
    return tally


def main(argv):
    del argv
    tf.compat.v1.disable_eager_execution()
    logging.set_verbosity(logging.ERROR)
    tf.get_logger().setLevel("ERROR")
    start = time.time()
    families = ["recurrent"] if FLAGS.recurrent else FLAGS.families
    suite = make_suite(FLAGS.suite, FLAGS.grouped, families)
    max_depth = FLAGS.max_depth or suite.max_depth
    if FLAGS.workers > 1:
        tally = run_parallel(FLAGS.workers, FLAGS.examples, FLAGS.seed, max_depth,
                             FLAGS.progress_every, FLAGS.time_limit_s, FLAGS.suite,
                             FLAGS.grouped, FLAGS.violations_log, families)
    else:
        tally = run(FLAGS.examples, FLAGS.seed, max_depth, FLAGS.progress_every,
                    FLAGS.time_limit_s, suite=suite, violations_log=FLAGS.violations_log)
    elapsed = time.time() - start
    print(f"\n{tally.examples} examples ({FLAGS.suite} suite"
          f"{', families ' + ','.join(FLAGS.families) if FLAGS.families else ''}, seed {FLAGS.seed}, "
          f"{FLAGS.workers} worker(s)) in {elapsed:.0f} s; "
          f"{tally.failing_examples} violate at least one invariant; by kind: "
          + ", ".join(f"{k} {n}" for k, n in sorted(tally.kinds.items())))
    print(f"{'invariant':24s} violations")
    for name in suite.invariants:
        print(f"{name:24s} {tally.counts[name]}")
    for name, (net, message) in tally.smallest.items():
        small = suite.shrink(
            net, lambda n, name=name: name in suite.violations(n),
            budget=FLAGS.shrink_budget)
        if small != net:
            message = suite.violations(small).get(name, message)
        print(f"\nminimal example for {name}:\n{small.describe()}\n  {small!r}\n"
              f"  -> {message}")
    total = sum(tally.counts.values())
    print(f"\ntotal violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    app.run(main)
