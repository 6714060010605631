"""Runs the property-based invariants over many random small networks.

    .venv/bin/python tools/property_check.py --examples=10000 --seed=0

Hypothesis draws the networks (tools/_property_networks.py: depth 1-6; conv,
depthwise, dense, atrous; bias or not; batch norm fused, unfused or none;
ReLU, ReLU6, LeakyReLU or none; residual adds; concats with the block input
or the network input) from a fixed seed; each is checked against every
invariant of tools/_property_invariants.py. A progress line is printed every
--progress_every examples; at the end, the count of violations per invariant
and, for each violated one, the smallest violating network (greedily shrunk
further within --shrink_budget checks). --time_limit_s stops early and says so.
Exit status 1 on any violation, 0 otherwise.
"""
import multiprocessing
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's Conv2D+BiasAdd+Add+LeakyRelu fusion drops alpha (a TensorFlow bug,
# docs/known_limits.md): the exactness invariant needs it off.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
import hypothesis  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import _property_invariants as invariants  # pylint: disable=g-import-not-at-top
from tools import _property_networks as networks  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("examples", 10000, "Random networks to check.")
flags.DEFINE_integer("seed", 0, "Hypothesis seed (the run is reproducible).")
flags.DEFINE_integer("max_depth", 6, "Most blocks per network.")
flags.DEFINE_integer("progress_every", 100, "Print a progress line every N examples.")
flags.DEFINE_integer("shrink_budget", 40,
                     "Checks spent shrinking each violated invariant's example.")
flags.DEFINE_float("time_limit_s", 0.0, "Stop after this many seconds (0: none).")
flags.DEFINE_integer("workers", 1,
                     "Processes sharing the examples (worker i draws from seed "
                     "--seed * 1000 + i); for machines with more cores.")


class _TimeUp(Exception):
    pass


class _Tally(object):
    """Counts per invariant and the smallest violating network of each."""

    def __init__(self):
        self.examples = 0
        self.failing_examples = 0
        self.counts = {name: 0 for name in invariants.INVARIANTS}
        self.smallest = {}  # name -> (network, message)

    def merge(self, other: "_Tally") -> None:
        self.examples += other.examples
        self.failing_examples += other.failing_examples
        for name, count in other.counts.items():
            self.counts[name] += count
        for name, (net, message) in other.smallest.items():
            if name not in self.smallest or net.size() < self.smallest[name][0].size():
                self.smallest[name] = (net, message)

    def record(self, net, violated) -> None:
        self.examples += 1
        if violated:
            self.failing_examples += 1
        for name, message in violated.items():
            self.counts[name] += 1
            if name not in self.smallest or net.size() < self.smallest[name][0].size():
                self.smallest[name] = (net, message)


def _worker(args) -> _Tally:
    """One worker process of --workers (spawned: its own TensorFlow)."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    logging.set_verbosity(logging.ERROR)
    return run(*args)


def run_parallel(workers: int, num_examples: int, seed: int, max_depth: int,
                 progress_every: int, time_limit_s: float) -> _Tally:
    """`run` split over `workers` processes with seeds seed * 1000 + i."""
    counts = [num_examples // workers + (i < num_examples % workers)
              for i in range(workers)]
    jobs = [(n, seed * 1000 + i, max_depth, progress_every, time_limit_s, f"worker {i}: ")
            for i, n in enumerate(counts) if n]
    tally = _Tally()
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        for part in pool.map(_worker, jobs):
            tally.merge(part)
    return tally


def run(num_examples: int, seed: int, max_depth: int, progress_every: int,
        time_limit_s: float, label: str = "") -> _Tally:
    """Checks `num_examples` networks drawn from `seed`; returns the tally."""
    tally = _Tally()
    start = time.time()

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=num_examples, database=None, deadline=None,
                         phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(networks.networks(max_depth=max_depth))
    def check(net):
        if time_limit_s and time.time() - start > time_limit_s:
            raise _TimeUp()
        tally.record(net, invariants.violations(net))
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
    if FLAGS.workers > 1:
        tally = run_parallel(FLAGS.workers, FLAGS.examples, FLAGS.seed, FLAGS.max_depth,
                             FLAGS.progress_every, FLAGS.time_limit_s)
    else:
        tally = run(FLAGS.examples, FLAGS.seed, FLAGS.max_depth, FLAGS.progress_every,
                    FLAGS.time_limit_s)
    elapsed = time.time() - start
    print(f"\n{tally.examples} examples (seed {FLAGS.seed}, {FLAGS.workers} "
          f"worker(s)) in {elapsed:.0f} s; "
          f"{tally.failing_examples} violate at least one invariant")
    print(f"{'invariant':24s} violations")
    for name in invariants.INVARIANTS:
        print(f"{name:24s} {tally.counts[name]}")
    for name, (net, message) in tally.smallest.items():
        small = networks.shrink(
            net, lambda n, name=name: name in invariants.violations(n),
            budget=FLAGS.shrink_budget)
        if small != net:
            message = invariants.violations(small).get(name, message)
        print(f"\nminimal example for {name}:\n{small.describe()}\n  {small!r}\n"
              f"  -> {message}")
    total = sum(tally.counts.values())
    print(f"\ntotal violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    app.run(main)
