"""Data parallelism: replicas of one model, and workers, share their ranges.

Above the planner and the emitter, extending them through the hook they
declare (`qat.quantize.plan.replication.Replication`) without either
importing this room:

  replicas       -> TF1 towers, TF-Slim clones, MirroredStrategy replicas
                    found by structure; one range per tensor, named as the
                    single-replica eval graph names it
  replica_stats  -> a later call's replicas join the ranges an earlier call
                    built (contrib's model_fn style)
  worker_ranges  -> MultiWorkerMirroredStrategy: a step's range
                    statistics all-reduced across workers (one collective)
  data_parallel  -> `DataParallel`, the hook filled with the three above
"""
from qat.distribute.data_parallel import DATA_PARALLEL
from qat.distribute.data_parallel import DataParallel

__all__ = ["DATA_PARALLEL", "DataParallel"]
