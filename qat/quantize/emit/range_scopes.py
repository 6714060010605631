"""Range variables named after another quantizer: a recurrence's first step.

The steps of a recurrence share one range per cell value
(`qat.quantize.plan.model.recurrences`), named after the first step, so that a
checkpoint depends neither on the number of steps nor on the loop's form. The
quantizer owning the range may be built before the first step's: its spec's
`variables_prefix` is the first step's scope, and the first step's own
quantizer, which reads the range (`range_of`), takes the scope the variables
got instead of a new one.
"""
from typing import Callable, Dict, Optional, Tuple

from qat.quantize.emit.quantizer_spec import QuantizerSpec


class RangeScopes:
    """The name scopes of quantizers and of the range variables they own."""

    def __init__(self, unique_name: Callable[[str], str]):
        self._unique_name = unique_name
        # Quantizer index -> (variables_prefix asked for, the scope its variables got).
        self._scopes: Dict[int, Tuple[str, str]] = {}

    def quantizer_scope(self, spec: QuantizerSpec, declared: Optional[tuple]) -> str:
        """The scope of a quantizer's ops (and of its variables, unless named).

        Args:
          spec: the quantizer.
          declared: (scope, min, max variables) where it was declared early.

        Returns:
          A scope unique in the graph, or the one of the variables it reads.
        """
        if declared and not spec.variables_prefix:
            return declared[0]
        asked, got = self._scopes.get(spec.range_of, (None, None))
        if asked == spec.prefix:
            return got  # The first step, reading the range named after it.
        return self._unique_name(spec.prefix)

    def variables_scope(self, spec: QuantizerSpec, index: int, quantizer_scope: str,
                        declared: Optional[tuple]) -> str:
        """The scope of the variables quantizer `index` owns (and records it)."""
        if declared:
            scope = declared[0]
        elif spec.variables_prefix:
            scope = self._unique_name(spec.variables_prefix)
        else:
            scope = quantizer_scope
        if spec.variables_prefix:
            self._scopes[index] = (spec.variables_prefix, scope)
        return scope
