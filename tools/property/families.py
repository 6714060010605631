"""The property suites as families of generators, each with its invariants.

A suite draws from all its families (hypothesis's `one_of`: each example from
one family, every family alike) and checks each example against its
family's invariants; a family is added here, in one line of its suite.

  rewrite suite:   networks   (networks.py, invariants.py)
                   training   (training_runs.py, training_invariants.py)
                   recurrent  (sequences.py, invariants.py)
  converter suite: networks   (converter_networks.py, converter_invariants.py)
                   training   (converter_training_runs.py, training_invariants.py)
                   recurrent  (sequences.py, converter_invariants.py)

Recurrent networks are drawn at most `sequences.MAX_DEPTH` layers deep
(each layer is a whole sequence).
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hypothesis import strategies as st


@dataclasses.dataclass(frozen=True)
class Family:
    """One generator of a suite and what its examples must hold."""
    name: str
    example_type: type
    strategy: Callable      # max_depth -> hypothesis strategy of examples
    violations: Callable    # example -> {invariant: message} of the violated ones
    shrink: Callable        # (example, still_fails, budget) -> a smaller example
    invariants: Tuple[str, ...]


def rewrite_families(grouped: bool = False) -> List[Family]:
    """The rewrite suite's families (`grouped` is the converter suite's)."""
    del grouped
    from tools.property import invariants  # pylint: disable=g-import-not-at-top
    from tools.property import networks  # pylint: disable=g-import-not-at-top
    from tools.property import rewrite_checks  # pylint: disable=g-import-not-at-top
    from tools.property import training_runs  # pylint: disable=g-import-not-at-top
    return [
        Family("networks", networks.Network, lambda depth: networks.networks(max_depth=depth),
               rewrite_checks.violations, networks.shrink, invariants.INVARIANTS),
        Family("training", training_runs.TrainingRun, training_runs.training_runs,
               training_runs.violations, training_runs.shrink, training_runs.INVARIANTS),
        _recurrent_family(rewrite_checks.violations, invariants.INVARIANTS),
    ]


def converter_families(grouped: bool = False) -> List[Family]:
    """The converter suite's families; `grouped`: grouped convolutions too."""
    from tools.property import converter_invariants  # pylint: disable=g-import-not-at-top
    from tools.property import converter_networks  # pylint: disable=g-import-not-at-top
    from tools.property import converter_training_runs  # pylint: disable=g-import-not-at-top
    return [
        Family("networks", converter_networks.ConvNet,
               lambda depth: converter_networks.conv_networks(depth, grouped=grouped),
               converter_invariants.violations, converter_networks.shrink,
               converter_invariants.INVARIANTS),
        Family("training", converter_training_runs.ConverterTrainingRun,
               lambda depth: converter_training_runs.training_runs(depth, grouped=grouped),
               converter_training_runs.violations, converter_training_runs.shrink,
               converter_training_runs.INVARIANTS),
        _recurrent_family(converter_invariants.violations, converter_invariants.INVARIANTS),
    ]


def _recurrent_family(violations: Callable, invariants: Tuple[str, ...]) -> Family:
    """Recurrent networks (tools/property/sequences.py) checked by `violations`."""
    from tools.property import sequences  # pylint: disable=g-import-not-at-top
    return Family("recurrent", sequences.SeqNet,
                  lambda depth: sequences.sequence_networks(max_depth=min(depth, sequences.MAX_DEPTH)),
                  violations, sequences.shrink, invariants)


SUITES: Dict[str, Callable[[bool], List[Family]]] = {
    "rewrite": rewrite_families,
    "converter": converter_families,
}


@dataclasses.dataclass(frozen=True)
class Combined:
    """A suite's families as one: what `tools/property/check.py` runs."""
    families: Tuple[Family, ...]

    @property
    def invariants(self) -> Tuple[str, ...]:
        names: List[str] = []
        for family in self.families:
            names += [n for n in family.invariants if n not in names]
        return tuple(names)

    def strategy(self, max_depth: int):
        return st.one_of(*[f.strategy(max_depth) for f in self.families])

    def family_of(self, example) -> Family:
        return next(f for f in self.families if isinstance(example, f.example_type))

    def violations(self, example) -> Dict[str, str]:
        return self.family_of(example).violations(example)

    def shrink(self, example, still_fails, budget: int = 40):
        return self.family_of(example).shrink(example, still_fails, budget=budget)


def combine(suite: str, grouped: bool = False,
            names: Optional[Sequence[str]] = None) -> Combined:
    """The families of `suite` (those called `names`, or all) combined.

    Raises:
      ValueError: a name is not one of the suite's families.
    """
    families = SUITES[suite](grouped)
    if names:
        unknown = set(names) - {f.name for f in families}
        if unknown:
            raise ValueError(f"no family {sorted(unknown)} in the {suite} suite; it has "
                             f"{[f.name for f in families]}")
        families = [f for f in families if f.name in names]
    return Combined(tuple(families))
