"""One call from an eval graph to checked .tflite files: freeze, convert,
verify integer-only and that every activation range survived the conversion,
optionally compare with the graph.

Two converters: TF1's `TFLiteConverter.from_session` on the frozen graph
(`converter="session"`, uint8 and int8), or TF 2's
`TFLiteConverter.from_saved_model` on a TF 2 SavedModel written from it
(`converter="saved_model"`, int8; `qat.export.saved_model`). A model with
16-bit activations beside 8-bit ones (a recipe's 16-bit layers), which TF's
converters refuse, is made by ai-edge-quantizer from qat's ranges
(`qat.export.edge_quantizer`) and checked against its reference graph."""
import dataclasses
import os
import time
from typing import Dict, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from absl import logging

from qat.export import convert, edge_quantizer, freeze, functions, inspect, kernel_checks, parity
from qat.export import range_survival
from qat.export import float_layers as float_layers_lib
from qat.export import saved_model as saved_model_lib
from qat.export.errors import ExportError

# Examples handed to ai-edge-quantizer for the ranges of tensors no FakeQuant
# quantizes (pass-through ops: SPLIT, TRANSPOSE).
_SAMPLE_EXAMPLES = 128


@dataclasses.dataclass
class ExportedModel:
    """One converted flavour."""
    flavour: str
    path: str
    model: bytes
    report: "inspect.ModelReport"
    parity: Optional["parity.ParityReport"]
    convert_seconds: float
    saved_model_dir: Optional[str] = None  # The SavedModel it was converted from.
    survival: Optional["range_survival.SurvivalReport"] = None

    @property
    def size_bytes(self) -> int:
        return len(self.model)


def export_tflite(input_names: Sequence[str],
                  output_names: Sequence[str],
                  output_dir: str,
                  sess: Optional[tf.compat.v1.Session] = None,
                  graph_path: Optional[str] = None,
                  checkpoint: Optional[str] = None,
                  frozen_graph_def: Optional[tf.compat.v1.GraphDef] = None,
                  flavours: Sequence[str] = convert.FLAVOURS,
                  name: str = "model",
                  input_ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
                  int8_io: bool = False,
                  default_input_range: Optional[Tuple[float, float]] = None,
                  require_integer: bool = True,
                  parity_inputs: Optional["parity.Inputs"] = None,
                  min_top1_agreement: Optional[float] = None,
                  max_diff_steps: Optional[float] = None,
                  converter: str = "session",
                  allow_lost_ranges: bool = False,
                  float_layers: Sequence[str] = ()) -> Dict[str, ExportedModel]:
    """Exports an eval graph (from create_eval_graph) to integer TFLite models.

    Give one of: a live `sess` (its variables hold the trained values), a
    `graph_path` (.meta, .pb, .pbtxt) with a `checkpoint`, or a
    `frozen_graph_def` (from freeze.freeze_session / freeze_graph_file).

    Args:
      input_names, output_names: tensor names of the eval graph.
      output_dir: where `<name>_<flavour>.tflite` files are written.
      sess: a session on the eval graph with restored variables.
      graph_path: a graph file, when no session is given.
      checkpoint: checkpoint prefix or directory for `graph_path`.
      frozen_graph_def: an already frozen eval graph.
      flavours: any of "uint8", "int8".
      name: file name stem.
      input_ranges: {input: (min, max)} real input ranges; see
        convert.convert_frozen_graph.
      int8_io: int8 instead of float input/output for the int8 flavour.
      default_input_range: range of float inputs that have neither an entry
        in `input_ranges` nor a FakeQuant reading them. Integer inputs (token
        ids, masks) need none: they stay integer inputs of the model.
      require_integer: raise FloatOpError if an op is left in float.
      parity_inputs: if given, run the models and the graph on these inputs:
        an array for the first input, or {input name: array} for every input
        (integer ids and masks are fed as they are).
      min_top1_agreement, max_diff_steps: parity thresholds (ParityError).
      converter: "session" (TF1's converter on the frozen graph) or
        "saved_model": writes `<output_dir>/<name>_saved_model`, a TF 2
        SavedModel with a `serving_default` signature, and converts it with
        `tf.lite.TFLiteConverter.from_saved_model` (int8 flavour only).
      allow_lost_ranges: export even when an activation range of the eval
        graph is no tensor of the model with its scale and zero point
        (`range_survival.check_ranges`: the integer model computes on
        another grid there), with a warning naming them. Ranges of ops the
        converter removed whose value keeps the same quantization are
        always only warned about.
      float_layers: the name scopes of the layers a recipe keeps float;
        by default, with `sess`, those its rewrite recorded in the graph
        (`float_layers.float_scopes_of_graph`). With `require_integer`, the model must be integer except these
        layers and the ops reading their float outputs, and each must be
        float (`qat.export.float_layers`).

    A graph with 16-bit activations beside 8-bit ones (a recipe's 16-bit
    layers) is exported by ai-edge-quantizer fed the graph's ranges
    (`qat.export.edge_quantizer`): flavour "int8" only, `parity_inputs`
    required (its first examples also give the ranges of pass-through
    tensors), the parity checked against the eval graph with LiteRT's
    int16 -> int8 requantizations; the model's input and output are then
    integer and it has no SignatureDef. Float layers and per-channel weights
    are refused beside 16-bit layers (RecipeError).

    Returns:
      {flavour: ExportedModel}.

    Raises:
      ExportError and its subclasses (see qat.export.errors); RangeLostError
      when a range is lost (unless `allow_lost_ranges`); KernelPreconditionError
      before converting when a range violates a precondition of TFLite's
      integer kernels (`qat.export.kernel_checks`: a checkpoint written before
      qat's range updates enforced them).
    """
    if sum(x is not None for x in (sess, graph_path, frozen_graph_def)) != 1:
        raise ExportError("give exactly one of sess= (a live session), graph_path= "
                          "or frozen_graph_def=")
    for flavour in flavours:
        if flavour not in convert.FLAVOURS:
            raise ExportError(f"unknown flavour {flavour!r}: use one of {convert.FLAVOURS}")
    if converter not in ("session", "saved_model"):
        raise ExportError(f"unknown converter {converter!r}: use 'session' or 'saved_model'")
    if converter == "saved_model" and list(flavours) != ["int8"]:
        raise ExportError("converter='saved_model' (TF 2's converter) makes int8 models only: "
                          "pass flavours=['int8'], or converter='session' for uint8")
    if sess is not None:
        if not float_layers:  # The recipe's float layers, as the rewrite recorded them.
            float_layers = float_layers_lib.float_scopes_of_graph(sess.graph)
        freeze.check_tensor_names(sess.graph, input_names, "input")
        frozen = freeze.freeze_session(sess, output_names)
        source = sess.graph.as_graph_def()
    elif graph_path is not None:
        frozen = freeze.freeze_graph_file(graph_path, checkpoint, output_names)
        source = freeze.load_graph_file(graph_path)[0]
    else:
        freeze.check_tensor_names(frozen_graph_def, output_names, "output")
        frozen = source = frozen_graph_def
    freeze.check_tensor_names(frozen, input_names, "input")
    for flavour in flavours:  # uint8 of per-channel weights: refused before any file.
        convert.check_flavour(frozen, flavour)
    islands = float_layers_lib.check_activation_bits(frozen, float_layers)
    if islands and list(flavours) != ["int8"]:
        raise ExportError(
            f"16-bit activations ({islands[0]}, ...) beside 8-bit ones export as one int8 / "
            "int16 model by ai-edge-quantizer: pass flavours=['int8']")
    # Ranges a kernel would refuse (an old checkpoint): refused before converting.
    kernel_checks.check_kernel_preconditions(frozen, flavours,
                                             label=os.path.join(output_dir, name))
    results = {}
    saved_model_dir = None
    for flavour in flavours:
        start = time.perf_counter()
        reference = frozen
        if islands:
            model, reference = _mixed_precision(frozen, input_names, output_names,
                                                parity_inputs, os.path.join(output_dir, name))
        elif converter == "saved_model":
            saved_model_dir = saved_model_lib.write_saved_model(
                frozen, input_names, output_names,
                os.path.join(output_dir, f"{name}_saved_model"), input_ranges=input_ranges,
                default_input_range=default_input_range)
            model = saved_model_lib.convert_saved_model(saved_model_dir, int8_io=int8_io,
                                                        graph_def=frozen)
        else:
            model = convert.convert_frozen_graph(frozen, input_names, output_names, flavour,
                                                 input_ranges=input_ranges, int8_io=int8_io,
                                                 default_input_range=default_input_range)
        seconds = time.perf_counter() - start
        path = convert.write_model(model, os.path.join(output_dir, f"{name}_{flavour}.tflite"))
        results[flavour] = _checked(
            model, flavour, path, seconds, reference, reference if islands else source,
            input_names, output_names,
            require_integer, allow_lost_ranges, parity_inputs, min_top1_agreement,
            max_diff_steps, saved_model_dir, float_layers, mixed=bool(islands))
    return results


def export_model(model,
                 output_dir: str,
                 name: str = "model",
                 int8_io: bool = False,
                 require_integer: bool = True,
                 parity_inputs: Optional["parity.Inputs"] = None,
                 min_top1_agreement: Optional[float] = None,
                 max_diff_steps: Optional[float] = None,
                 allow_lost_ranges: bool = False,
                 float_layers: Optional[Sequence[str]] = None) -> ExportedModel:
    """Exports a quantized TF 2 model with TF 2's converter, checked.

    The eval rewrite (`model.inference_function()`) is converted by
    `tf.lite.TFLiteConverter.from_concrete_functions` with
    `optimizations=[DEFAULT]` to `<output_dir>/<name>_int8.tflite`, then held to
    the checks of `export_tflite`: fully integer, runnable, every activation
    range a tensor of the model, and (with `parity_inputs`) agreement with the
    eval rewrite, run as its frozen graph.

    Args:
      model: a quantized model from `qat.quantize_model`, or a concrete
        function of an eval rewrite.
      output_dir: where the .tflite file is written.
      name: file name stem.
      int8_io: int8 instead of float input and output (integer inputs such as
        token ids stay integer).
      require_integer, parity_inputs, min_top1_agreement, max_diff_steps,
        allow_lost_ranges: as in `export_tflite`; `parity_inputs` is an array
        for the first input or {input name: array} with the function's input
        names (`FrozenFunction.input_names`, `<argument name>:0`).
      float_layers: as in `export_tflite`; None: the layers `model`'s recipe
        keeps float (`model.layer_precisions`).

    16-bit layers beside 8-bit ones are exported by ai-edge-quantizer, as in
    `export_tflite` (`parity_inputs` required; integer input and output, no
    SignatureDef).

    Returns:
      The `ExportedModel` (flavour "int8").

    Raises:
      ExportError and its subclasses (see qat.export.errors); KernelPreconditionError
      as in `export_tflite`.
    """
    if float_layers is None:
        float_layers = float_layers_lib.float_scopes_of(getattr(model, "layer_precisions", ()))
    function = functions.concrete_function_of(model)
    frozen = functions.freeze_function(function)
    islands = float_layers_lib.check_activation_bits(frozen.graph_def, float_layers)
    # Ranges a kernel would refuse (an old checkpoint): refused before converting.
    kernel_checks.check_kernel_preconditions(frozen.graph_def, ("int8",),
                                             label=os.path.join(output_dir, name))
    start = time.perf_counter()
    reference = frozen.graph_def
    if islands:  # 16-bit layers beside 8-bit ones: ai-edge-quantizer, as in export_tflite.
        tflite, reference = _mixed_precision(frozen.graph_def, frozen.input_names,
                                             frozen.output_names, parity_inputs,
                                             os.path.join(output_dir, name))
    else:
        tflite = functions.convert_function(function, int8_io=int8_io)
    seconds = time.perf_counter() - start
    path = convert.write_model(tflite, os.path.join(output_dir, f"{name}_int8.tflite"))
    return _checked(tflite, "int8", path, seconds, reference, reference,
                    frozen.input_names, frozen.output_names, require_integer,
                    allow_lost_ranges, parity_inputs, min_top1_agreement, max_diff_steps, None,
                    float_layers, mixed=bool(islands))


def _checked(model: bytes, flavour: str, path: str, seconds: float,
             frozen: tf.compat.v1.GraphDef, source: tf.compat.v1.GraphDef,
             input_names: Sequence[str], output_names: Sequence[str],
             require_integer: bool, allow_lost_ranges: bool,
             parity_inputs, min_top1_agreement, max_diff_steps,
             saved_model_dir: Optional[str], float_layers: Sequence[str] = (),
             mixed: bool = False) -> ExportedModel:
    """Checks a converted model against its frozen eval graph (see export_tflite).

    `mixed`: ai-edge-quantizer's model, given each range by qat
    (`edge_quantizer.EdgeQuantizedModel.tensor_bits`): no range survival
    check (it matches TF's converter's tensors), `survival` None.
    """
    if require_integer and float_layers:
        report = float_layers_lib.check_float_layers(model, frozen, float_layers, label=path)
    elif require_integer:
        report = inspect.check_fully_integer(model, frozen, label=path,
                                             source_graph_def=source)
    else:
        report = inspect.describe_model(model)
    inspect.check_runnable(model, frozen, label=path)
    survival = None if mixed else range_survival.check_ranges(frozen, model, flavour=flavour)
    if survival is not None and survival.differing and not allow_lost_ranges:
        range_survival.check_range_survival(frozen, model, label=path)  # Raises.
    for lost in survival.lost if survival is not None else ():
        logging.warning("%s: range lost in conversion: %s", path, lost.describe())
    parity_report = None
    if parity_inputs is not None:
        parity_report = parity.check_parity(
            model, frozen, input_names, output_names[0], parity_inputs,
            min_top1_agreement=min_top1_agreement, max_diff_steps=max_diff_steps)
    return ExportedModel(flavour, path, model, report, parity_report, seconds,
                         saved_model_dir, survival)


def _mixed_precision(frozen: tf.compat.v1.GraphDef, input_names: Sequence[str],
                     output_names: Sequence[str], parity_inputs, label: str
                     ) -> Tuple[bytes, tf.compat.v1.GraphDef]:
    """(model, reference graph) of ai-edge-quantizer's int8 / int16 model of `frozen`.

    Raises:
      ExportError: no `parity_inputs` (a batch is needed for the ranges of
        pass-through tensors); EdgeQuantizerUnavailableError.
    """
    if parity_inputs is None:
        raise ExportError(
            f"{label}: 16-bit activations beside 8-bit ones are exported by ai-edge-quantizer, "
            "which needs examples for the ranges of pass-through tensors (SPLIT, TRANSPOSE): "
            "give parity_inputs (an array, or {input name: array})")
    tensor = lambda n: n if ":" in n else n + ":0"  # pylint: disable=unnecessary-lambda-assignment
    inputs, outputs = [tensor(n) for n in input_names], [tensor(n) for n in output_names]
    feeds = parity.input_feeds(inputs, parity_inputs)
    sample = [feeds[freeze.op_name(n)][:_SAMPLE_EXAMPLES] for n in inputs]
    result = edge_quantizer.mixed_precision_model(frozen, inputs, outputs, sample)
    logging.info("%s: 16-bit tensors %s", label,
                 sorted(t for t, bits in result.tensor_bits.items() if bits == 16))
    return result.model, result.reference_graph_def
