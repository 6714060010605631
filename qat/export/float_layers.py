"""The float layers a recipe asked for, held against the converted model.

A recipe (`qat.Recipe`) that keeps a layer float leaves its weights and its
output without FakeQuant; TF's converter then computes it in float, with a
DEQUANTIZE before it and a QUANTIZE where the next range is. So a mixed
model is "integer except where the recipe says", and this module checks
exactly that instead of `inspect.check_fully_integer`:

* every float op of the model is a float layer's (its TF ops lie under the
  layer's name scope), or reads only float values such ops computed (the
  ops after a float layer up to the next range: a pool reading its float
  output);
* 16-bit activations beside 8-bit ones (`check_activation_bits`): TF's
  converter refuses them (it inserts no int16 <-> int8 requantization), so
  the export hands such a model to `qat.export.edge_quantizer`, which has no
  float islands and per-tensor weights only: those recipes are refused.
* every float layer is float in the model. TF's converter quantizes a float
  layer whose input and output are both quantized (between two integer
  layers: it quantizes its weights itself); the export refuses that model,
  naming the layer.

The float layers' scopes come from the recipe's decisions
(`qm.layer_precisions` of a `qat.quantize_model` model; on the graph path
the graph's `qat_float_layers` collection, which the rewrite fills), never
from op types.
"""
from typing import List, Sequence

import tensorflow as tf

from qat.engine import recipes
from qat.export import inspect
from qat.export.errors import FloatOpError

# FakeQuant ops of a frozen graph.
_FAKE_QUANT_TYPES = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel",
                     "FakeQuantWithMinMaxArgs")


def float_scopes_of(layers: Sequence) -> List[str]:
    """The name scopes of the layers a recipe keeps float.

    Args:
      layers: `qat.quantize.plan.ranges.precisions.Layer`s (a quantized
        model's `layer_precisions`, a rewrite's `QuantizeResult.layers`).
    """
    return [layer.info.name for layer in layers if layer.precision.keep_float]


def float_scopes_of_graph(graph: tf.Graph) -> List[str]:
    """The float layers' name scopes a recipe's rewrite recorded in `graph`."""
    return list(dict.fromkeys(graph.get_collection(recipes.FLOAT_LAYERS_COLLECTION)))


def _under(name: str, scopes: Sequence[str]) -> bool:
    return any(name == s or name.startswith(s + "/") for s in scopes)


def check_float_layers(model: bytes, graph_def: tf.compat.v1.GraphDef,
                       float_scopes: Sequence[str], label: str = "model"
                       ) -> inspect.ModelReport:
    """Raises FloatOpError unless the model is integer except the float layers.

    Args:
      model: the .tflite bytes.
      graph_def: the frozen graph it came from (names the TF ops).
      float_scopes: the name scopes of the layers the recipe keeps float.
      label: how to call the model in the message.

    Returns:
      The ModelReport.

    Raises:
      FloatOpError: a float op no float layer explains, or a float layer the
        converter made integer.
    """
    report = inspect.describe_model(model)
    float_ops = inspect.find_float_ops(report, graph_def)
    produced = {t: op for op in report.ops for t in op.outputs}
    allowed_tensors = set()
    unexplained = []
    seen_scopes = set()
    for float_op in float_ops:
        op = report.ops[float_op.tflite_index]
        names = [name for name, _ in float_op.tf_ops]
        # The layer's op (fused with identities after it, the model output's name).
        in_layer = any(_under(n, float_scopes) for n in names)
        float_inputs = [i for i, t in zip(op.inputs, op.input_types)
                        if inspect._is_float(t) and i in produced]  # pylint: disable=protected-access
        after_layer = bool(float_inputs) and all(i in allowed_tensors for i in float_inputs)
        if in_layer or after_layer:
            allowed_tensors.update(op.outputs)
            seen_scopes.update(s for s in float_scopes for n in names if _under(n, [s]))
        else:
            unexplained.append(float_op)
    if unexplained:
        lines = "\n  ".join(f.describe() for f in unexplained)
        raise FloatOpError(
            f"{label}: {len(unexplained)} op(s) compute in float that no float layer of the "
            f"recipe explains (float layers: {', '.join(float_scopes) or 'none'}):\n  {lines}\n"
            "Their TF tensors had no min/max range: quantize them, or keep their layer float "
            "in the recipe.", unexplained)
    integer = [s for s in float_scopes if s not in seen_scopes]
    if integer:
        raise FloatOpError(
            f"{label}: the recipe keeps {', '.join(integer)} float, but TF's converter made "
            "it integer: a layer whose input and output are both quantized (between two "
            "integer layers) is quantized by the converter, its weights at 8 bits. Keep the "
            "layer after it float too (a float rule selecting both), or quantize it.")
    return report


def check_activation_bits(graph_def: tf.compat.v1.GraphDef,
                          float_scopes: Sequence[str] = ()) -> List[str]:
    """The 16-bit activation FakeQuants of a graph that also has 8-bit ones.

    Such a model (a recipe's 16-bit layers) is exported by ai-edge-quantizer
    (`qat.export.edge_quantizer`): TF's converter refuses a 16-bit activation
    inside an 8-bit model ("'tfl.tanh' op failed to verify that input and
    output must have same element type"). A model whose every activation is
    16-bit (TF's 16x8 mode) or none gives [].

    Args:
      graph_def: a frozen eval graph.
      float_scopes: the name scopes of the layers the recipe keeps float.

    Returns:
      The names of the 16-bit activation FakeQuants, [] when not mixed.

    Raises:
      RecipeError: 16-bit islands with float layers or per-channel weights,
        which ai-edge-quantizer's path does not handle.
    """
    nodes = {n.name: n for n in graph_def.node}
    bits = {}
    per_channel = []
    for node in graph_def.node:
        if node.op in _FAKE_QUANT_TYPES and node.input:
            source = nodes.get(node.input[0].split(":")[0].lstrip("^"))
            if node.op.endswith("PerChannel"):
                per_channel.append(node.name)
            elif source is not None and source.op != "Const":  # Weights are constants.
                bits[node.name] = node.attr["num_bits"].i if "num_bits" in node.attr else 8
    wide = sorted(name for name, b in bits.items() if b == 16)
    if not wide or len(wide) == len(bits):
        return []
    shown = ", ".join(wide[:8]) + (f" and {len(wide) - 8} more" if len(wide) > 8 else "")
    if float_scopes:
        raise recipes.RecipeError(
            f"the model has 16-bit activations ({shown}) beside 8-bit ones and float layers "
            f"({', '.join(float_scopes)}): ai-edge-quantizer, which exports 16-bit layers in an "
            "8-bit model, does not keep float islands. Quantize those layers, or drop "
            "activation_bits 16 from the recipe.")
    if per_channel:
        raise recipes.RecipeError(
            f"the model has 16-bit activations ({shown}) beside 8-bit ones and per-channel "
            f"weights ({', '.join(per_channel[:4])}): ai-edge-quantizer's export of 16-bit "
            "layers takes per-tensor weights only. Quantize with per_channel False (the "
            "options and the recipe's rules), or drop activation_bits 16.")
    return wide
