"""The hook through which data-parallel replicas extend the quantize pass.

The planner and the emitter are written for one model. Where a graph holds
several replicas of it (TF1 towers, TF-Slim clones, `tf.distribute`
strategies), `qat.distribute` makes the replicas share one range per tensor;
it extends this pass through a `Replication` the caller passes in
(`qat.api` passes `qat.distribute.DataParallel`), so neither the planner nor
the emitter imports it. The default, `SINGLE_MODEL`, changes nothing.
"""
from typing import List, Optional


class Replication(object):
    """What a graph's replicas add to the quantize pass (here: nothing).

    `qat.distribute.DataParallel` implements each method.
    """

    def share(self, planner, plans: List) -> List:
        """The plans once replicas of one tensor share a range.

        Called by `Planner.run` after its visits.

        Args:
          planner: the `qat.quantize.plan.Planner` that made `plans`.
          plans: its plans (`qat.quantize.plan.Plan`), in planning order.

        Returns:
          The plans to build (the default: `plans`, unchanged).
        """
        del planner
        return plans

    def all_reduce(self) -> Optional[object]:
        """What each training range update all-reduces its statistics with.

        Returns:
          An object with `emit(nodes, scope, value, merge_op)` (as
          `qat.distribute.worker_ranges.WorkerAllReduce`), called once per
          rewrite with every range's statistics packed in one vector
          (`qat.quantize.emit.step_statistics`), or None: ranges are not
          reduced across processes (the default).
        """
        return None

    def joins_later_replicas(self) -> bool:
        """Whether later calls will quantize more replicas of this model.

        Then a training rewrite combines its ranges' statistics once per
        step where those calls can join them
        (`qat.quantize.emit.step_statistics`). Default: False.
        """
        return False

    def join_statistics(self, rewrite, plans: List) -> None:
        """Adds to a training `rewrite` what joins replicas' batch statistics.

        Args:
          rewrite: the quantize pass's `qat.engine.rewrite.Rewrite`.
          plans: the plans being built.
        """
        del rewrite, plans


SINGLE_MODEL = Replication()
