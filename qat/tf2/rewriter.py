"""Tracing a TF 2 model into a function and rewriting it as the graph path does.

`FunctionRewriter` holds one `tf.function` per mode. Tracing one calls the
model (its ops land in the function's graph), ends every output with an
Identity (so the output's quantizer has a reader to feed, as
`tf.identity(logits, name=...)` does in a graph), then runs
`qat.api.rewrite_graph` — the fold and quantize passes of the graph path,
every planner rule included — on the graph while it is still being traced
(`qat.engine.function_graphs`). The function returns the quantized outputs.

The training function folds batch norms with batch statistics and learns
ranges; the eval function folds with the moving statistics and reads them.
Both read the same variables (`qat.tf2.ranges.RangeStore`), made by the
first trace of the training function (`plan`). A Keras model under a mixed
precision policy is traced computing in float32, and the training function's
quantized layers then compute in their layers' dtype (`qat.tf2.precision`).
Its recurrent layers that may run as a cuDNN op are traced on their generic
path (`qat.tf2.recurrent_kernels`), on machines with a GPU as without.
The training function also counts, per range, the batches whose values were
not finite (`skipped_batches`); Python reads the counters where it runs
anyway (an eager training call, Keras's `fit`, `inference_function`) and
warns once per range, so the training function itself stays free of host ops.

Under XLA. A training call made in an XLA context (a
`tf.function(jit_compile=True)`: Keras's `jit_compile`, a custom step)
goes to a training function of its own, whose traces are marked as compiled
by XLA (`qat.engine.xla_compilation`): the gradients of their quantizers take
the form XLA compiles. A `tf.function` reuses a trace made outside XLA inside
XLA, and builds a trace's gradient once, so the mode cannot be told apart
later, inside one function. Its outputs pass through
`xla_outputs.function_outputs`, so that its gradient reads no constant
from it (XLA would otherwise fold the whole call in and compile every step
anew). The eval function has no gradient of qat's and serves both.
"""
import contextlib
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from qat import api
from qat.engine import config as config_lib
from qat.engine import function_graphs
from qat.engine import xla_compilation
from qat.matching import layer_patterns
from qat.quantize.emit import finite_ranges
from qat.tf2 import calls
from qat.tf2 import precision as precision_lib
from qat.tf2 import ranges
from qat.tf2 import recurrent_kernels
from qat.tf2 import replicas
from qat.tf2 import xla_outputs


class FunctionRewriter(object):
    """The training and eval functions of one quantized model.

    Args:
      call: the model and how to call it.
      configs: {training: the validated RewriteConfig of that mode}.
      store: where the ranges live.
      precision: a Keras model's layer dtypes; None for a model without
        Keras layers (traced as it computes).
      recurrences: a Keras model's recurrent layers that may run as a cuDNN
        op, traced on their generic path (`qat.tf2.recurrent_kernels`).
    """

    def __init__(self, call: calls.ModelCall,
                 configs: Dict[bool, config_lib.RewriteConfig],
                 store: ranges.RangeStore,
                 precision: Optional[precision_lib.Precision] = None,
                 recurrences: Optional[recurrent_kernels.GenericRecurrences] = None):
        self.call = call
        self.precision = precision if precision is not None and precision.is_mixed else None
        self.recurrences = recurrences
        # Keras models name their ops after themselves; a tf.Module or a
        # function is scoped by its name, so its ranges are `<name>/...`.
        self.scope = "" if call.inputs_as_one else _identifier(call.name) + "/"
        self.configs = configs
        self.store = store
        self._replication = replicas.TraceReplication(store)
        self.functions = {
            training: tf.function(self._traced(training), input_signature=call.signature,
                                  autograph=True)
            for training in (True, False)}
        # Training calls made in an XLA context (made on the first such call).
        self._xla_training = None
        # Per mode, of its latest trace: what was left float, and why.
        self.left_float: Dict[bool, List[str]] = {True: [], False: []}
        self.quantizer_names: Dict[bool, List[str]] = {True: [], False: []}
        # Per mode, of its latest trace: with a recipe, each layer and its precision.
        self.layers: Dict[bool, list] = {True: [], False: []}
        # Of the latest training trace: the layer ops computing in float16 /
        # bfloat16 (`qat.tf2.precision`), by the names of the float32 ops.
        self.low_precision_layers: List[str] = []
        self.model_variables: List[tf.Variable] = []
        # {range name: the tensor it quantizes}, of the training trace.
        self.range_tensors: Dict[str, str] = {}
        self._read_counters: Optional[tf.types.experimental.GenericFunction] = None
        self._planned_layers = set()
        self._error = None

    def _traced(self, training: bool, xla: bool = False):
        def quantized_model(*inputs):
            if xla:
                xla_compilation.mark_compiled(tf.compat.v1.get_default_graph())
            float32 = (self.precision.float32_trace() if self.precision is not None
                       else contextlib.nullcontext())
            generic = (self.recurrences.trace() if self.recurrences is not None
                       else contextlib.nullcontext())
            with tf.name_scope(self.scope), float32, generic:
                outputs = self.call(list(inputs), training)
            outputs = self._rewrite(outputs, training)
            if xla:
                outputs = tf.nest.pack_sequence_as(
                    outputs, xla_outputs.function_outputs(tf.nest.flatten(outputs)))
            return outputs
        quantized_model.__name__ = "%s_%s%s" % (_identifier(self.call.name),
                                                "training" if training else "eval",
                                                "_xla" if xla else "")
        return quantized_model

    @property
    def xla_function(self):
        """The training function of calls made in an XLA context; None before the first."""
        return self._xla_training

    def _function(self, training: bool):
        """The function of a call in `training` mode made here (XLA or not)."""
        if not (training and xla_compilation.in_xla_context()):
            return self.functions[training]
        if self._xla_training is None:
            self._xla_training = tf.function(self._traced(True, xla=True),
                                             input_signature=self.call.signature,
                                             autograph=True)
        return self._xla_training

    @tf.autograph.experimental.do_not_convert
    def _rewrite(self, outputs, training: bool):
        graph = tf.compat.v1.get_default_graph()
        flat = tf.nest.flatten(outputs)
        ends = [tf.identity(t) for t in flat]
        with function_graphs.editing(graph, self.store, ends):
            try:
                result = api.rewrite_graph(graph, self.configs[training], self._replication)
            except ranges.UnplannedRangeError as e:
                self._error = ranges.UnplannedRangeError(f"{e}{self._new_layers(graph)}")
                raise self._error
            except (ValueError, TypeError) as e:
                self._error = e  # Kept: autograph re-raises it as another type.
                raise
            if self.store.planning:
                self._planned_layers = {op.name for op in layer_patterns.layer_ops(graph)}
            if training and self.precision is not None:
                self.low_precision_layers = self.precision.lower_layers(graph)
        self.quantizer_names[training] = result.quantize.names
        self.layers[training] = list(result.quantize.layers)
        if training:
            for q in result.quantize.quantizers:
                self.range_tensors.setdefault(q.range_name or q.name, q.tensor.name)
        self.left_float[training] = (
            [f"{s.name}: batch norm not folded: {s.reason}" for s in result.fold.skipped]
            + [f"{item.name}: {item.reason}" for item in result.quantize.left_float])
        return tf.nest.pack_sequence_as(outputs, ends)

    def _new_layers(self, graph: tf.Graph) -> str:
        """The layer ops of `graph` the planning trace did not have, as a sentence."""
        new = [f"{op.name} ({op.type})" for op in layer_patterns.layer_ops(graph)
               if op.name not in self._planned_layers]
        return f" Layers this call has that the plan had not: {', '.join(new)}." if new else ""

    def _traced_call(self, fn, *args):
        """`fn(*args)`, re-raising qat's own error of a trace as it was raised."""
        self._error = None
        try:
            return fn(*args)
        except Exception as e:  # pylint: disable=broad-except
            if self._error is not None and e is not self._error:
                raise self._error from None
            raise
        finally:
            self._error = None

    def plan(self) -> tf.types.experimental.ConcreteFunction:
        """Traces the training function once: every range is made here.

        Raises:
          ValueError / TypeError: the model refuses the signature, has no
            variables, or nothing to quantize.
        """
        try:
            replica = replicas.planning_replica()
            if replica is None:
                concrete = self._traced_call(self.functions[True].get_concrete_function)
            else:
                # Under a strategy, outside strategy.run: planned as replica 0
                # traces it in strategy.run (the model updating its replica's
                # variables, as the fold pass recognises), by a function of its
                # own, which no call reuses.
                with replica:
                    planning = tf.function(self._traced(True), input_signature=self.call.signature,
                                           autograph=True)
                    concrete = self._traced_call(planning.get_concrete_function)
        except (ValueError, TypeError) as e:
            if isinstance(e, ranges.UnplannedRangeError):
                raise
            raise type(e)(
                f"qat.quantize_model({self.call.name}): calling the model on "
                f"input_signature {self.call.signature} failed: {e}") from e
        finally:
            self.store.planning = False
        qat_variables = {id(v) for v in self.store.ordered}
        # Under a strategy the trace reads components: list their variables.
        found = {id(v): v for v in map(replicas.container, concrete.graph.variables)}
        self.model_variables = [v for k, v in found.items() if k not in qat_variables]
        if not self.model_variables:
            raise ValueError(
                f"qat.quantize_model({self.call.name}): the model reads no tf.Variable. "
                "qat quantizes layers whose weights are variables (Keras layers, "
                "tf.Variable attributes of a tf.Module); weights given as constants "
                "or tensors cannot be trained and get no ranges.")
        if not self.quantizer_names[True]:
            left = "; ".join(self.left_float[True]) or "no conv, depthwise conv, dense or matmul layer found"
            raise ValueError(
                f"qat.quantize_model({self.call.name}): nothing to quantize ({left}).")
        return concrete

    def __call__(self, inputs: Sequence, training):
        if not isinstance(training, bool):
            raise TypeError(
                f"{self.call.name}: training must be a Python bool (True or False), "
                f"got {training!r}.")
        if len(inputs) != len(self.call.signature):
            raise ValueError(
                f"{self.call.name} takes {len(self.call.signature)} input(s) "
                f"({self.call.signature}); got {len(inputs)}.")
        outputs = self._traced_call(self._function(training), *inputs)
        if (training and tf.executing_eagerly()
                and (not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context())):
            self.skipped_batches()  # Not per replica of an eager strategy.run.
        return outputs

    def inference_function(self) -> tf.types.experimental.ConcreteFunction:
        """The eval function, traced for the input signature."""
        self.skipped_batches()
        return self._traced_call(self.functions[False].get_concrete_function)

    def layer_precisions(self) -> list:
        """Each layer a recipe selected and the precision it got, from the eval
        trace (the training trace's when only that one ran); empty without a
        recipe."""
        return list(self.layers[False] or self.layers[True])

    def skipped_batches(self) -> Dict[str, int]:
        """{range name: training batches it skipped}; warns once per range.

        A range skips a batch whose min or max is NaN or infinite
        (`qat.quantize.emit.finite_ranges`): its value stays as it was. Reads
        the counters (one function call); a range that skipped any gets one
        warning per process naming it and the tensor it quantizes.
        """
        counters = self.store.statistics
        if not counters:
            return {}
        if self._read_counters is None:
            variables = list(counters.values())
            self._read_counters = tf.function(
                lambda: tf.stack([tf.convert_to_tensor(v) for v in variables]))
        with tf.init_scope():
            values = self._read_counters().numpy()
        counts = {name.rsplit("/", 1)[0]: int(v) for name, v in zip(counters, values)}
        finite_ranges.warn(counts, self.range_tensors)
        return counts


def _identifier(name: str) -> str:
    """`name` as a valid root name scope (`<lambda>` -> `lambda`)."""
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "_" for c in str(name))
    return cleaned.strip("_.-") or "model"
