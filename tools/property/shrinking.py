"""Greedy shrinking of a failing example, written once for every family.

A family gives one-step simplifications of an example (`simpler`, which may
yield invalid ones) and its validity test; `greedy` keeps taking the first
valid simplification that still fails, until none does or the budget of
candidates tried is spent.
"""
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def greedy(item: T, simpler: Callable[[T], Iterable[T]], valid: Callable[[T], bool],
           still_fails: Callable[[T], bool], budget: int = 40) -> T:
    """The simplest failing example found from `item`.

    Args:
      item: a failing example.
      simpler: example -> its one-step simplifications (maybe invalid).
      valid: whether the family can draw an example.
      still_fails: predicate on a candidate.
      budget: the most candidates tried.

    Returns:
      `item`, or the simplest valid candidate reached that still fails.
    """
    improved = True
    while improved and budget > 0:
        improved = False
        for candidate in simpler(item):
            if not valid(candidate):
                continue
            budget -= 1
            if still_fails(candidate):
                item, improved = candidate, True
                break
            if budget <= 0:
                break
    return item
