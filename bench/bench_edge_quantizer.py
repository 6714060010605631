"""LSTM digit rows: int8 everywhere against a 16-bit cell state (issue #42, item 4).

Each form of bench_recurrent.py (`--forms`) is trained float `--float_steps`
Adam steps and fine-tuned with QAT `--qat_steps` steps, then exported:

* `tf-int8`: TF's converter, all int8 (`qat.export.convert_function`, what
  `qat.export.export_model` does);
* `aeq-int8`: ai-edge-quantizer fed qat's ranges, all int8
  (`qat.export.edge_quantizer.mixed_precision_model`);
* `aeq-c16`: the same with the cell state int16: the activation FakeQuants of
  c = f * c + i * g (an Add of two Muls) and of those two Muls;
* `aeq-c16g16`: the cell state and the gates (FakeQuants of Sigmoid, Tanh and
  the Muls reading them) int16;
* `aeq-r16`: every activation but the dense head's int16 (the recurrence,
  the input included);
* `aeq-a16`: every activation int16.

Printed per form and export: the reference (the eval function, with those
FakeQuants on the int16 grid) and the TFLite model's accuracy, top-1 agreement,
the largest output difference in output steps, float ops, size.

  .venv/bin/python bench/bench_edge_quantizer.py
  .venv/bin/python bench/bench_edge_quantizer.py --forms=k3_lstm_unroll,tf1_static_lstm
"""
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl import app, flags  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_list("forms", ["k3_lstm_unroll", "tf1_static_lstm", "k3_lstm", "tf1_dynamic_lstm"],
                  "Forms of bench_recurrent.py to train and export.")
flags.DEFINE_integer("units", 32, "Units of the recurrent layer.")
flags.DEFINE_integer("float_steps", 1500, "Float training steps (batch 32, Adam 3e-3).")
flags.DEFINE_integer("qat_steps", 500, "QAT fine-tuning steps (Adam 3e-4).")
flags.DEFINE_integer("seed", 0, "Seed of the weights and the batches.")

_FQ = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")


def _source(nodes, name):
    """The op a FakeQuant (or a tensor) reads, back through Identity and FakeQuant."""
    node = nodes.get(name.split(":")[0].lstrip("^"))
    while node is not None and (node.op == "Identity" or node.op in _FQ):
        node = nodes.get(node.input[0].split(":")[0])
    return node


def int16_choices(graph_def, outputs):
    """{choice: [activation FakeQuant names]}: the cell state; it and the gates;
    every activation but the dense head's (the whole recurrence)."""
    nodes = {n.name: n for n in graph_def.node}
    fqs = [n for n in graph_def.node if n.op in _FQ]
    by_source = {}
    for fq in fqs:
        source = _source(nodes, fq.input[0])
        if source is not None:
            by_source.setdefault(source.name, []).append(fq.name)
    state, gates = set(), set()
    for name, fq_names in by_source.items():
        node = nodes[name]
        operands = [_source(nodes, i) for i in node.input]
        if node.op in ("Add", "AddV2") and all(o is not None and o.op == "Mul" for o in operands):
            state.update(fq_names)
            for o in operands:
                state.update(by_source.get(o.name, []))
        if node.op in ("Sigmoid", "Tanh") or (node.op == "Mul" and any(
                o is not None and o.op in ("Sigmoid", "Tanh") for o in operands)):
            gates.update(fq_names)
    head, node = set(), _source(nodes, outputs[0])
    while node is not None and node.op in ("BiasAdd", "Add", "AddV2", "MatMul"):
        head.update(by_source.get(node.name, []))
        node = _source(nodes, node.input[0]) if node.op != "MatMul" else None
    recurrence = {n for names in by_source.values() for n in names} - head
    return {"aeq-c16": sorted(state), "aeq-c16g16": sorted(state | gates),
            "aeq-r16": sorted(recurrence)}


def _train(form, directory):
    """(frozen graph_def, input names, output names, TF converter int8 model)."""
    import keras  # pylint: disable=import-outside-toplevel
    import qat  # pylint: disable=import-outside-toplevel
    from qat.export import freeze, functions  # pylint: disable=import-outside-toplevel
    from tools import _recurrent_models as models  # pylint: disable=import-outside-toplevel
    if form.startswith("k3_"):
        keras.utils.set_random_seed(FLAGS.seed)
        model = models._keras_model(form, FLAGS.units)  # pylint: disable=protected-access
        models._keras_train(model, FLAGS.float_steps, 3e-3, FLAGS.seed)  # pylint: disable=protected-access
        qm = qat.quantize_model(model)
        models._keras_train(qm, FLAGS.qat_steps, 3e-4, FLAGS.seed + 1, training=True)  # pylint: disable=protected-access
        function = qm.inference_function()
        frozen = functions.freeze_function(function)
        return (frozen.graph_def, frozen.input_names, frozen.output_names,
                functions.convert_function(function))
    from qat import export  # pylint: disable=import-outside-toplevel
    float_path, qat_path = os.path.join(directory, "float"), os.path.join(directory, "qat")
    models._tf1_train(form, FLAGS.units, FLAGS.float_steps, 3e-3, FLAGS.seed, None,  # pylint: disable=protected-access
                      float_path, quantized=False)
    models._tf1_train(form, FLAGS.units, FLAGS.qat_steps, 3e-4, FLAGS.seed + 1, float_path,  # pylint: disable=protected-access
                      qat_path, quantized=True)
    sess = models._tf1_eval(form, FLAGS.units, qat_path, quantized=True)  # pylint: disable=protected-access
    graph_def = freeze.freeze_session(sess, ["output"])
    int8 = export.convert_frozen_graph(graph_def, ["input:0"], ["output:0"], "int8")
    return graph_def, ["input:0"], ["output:0"], int8


def main(_):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from qat.export import edge_quantizer, edge_quantizer_graphs, inspect, parity  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    from tools import _recurrent_models as models  # pylint: disable=import-outside-toplevel
    (x, _), (xt, yt) = models.digit_rows()
    print(f"digit rows, {FLAGS.units} units; float {FLAGS.float_steps} steps, QAT "
          f"{FLAGS.qat_steps} steps; {len(yt)} held-out digits")
    print(f"{'form':<18} {'export':<11} {'int16_fqs':>9} {'ref_acc':>7} {'tflite':>7} "
          f"{'agree':>7} {'max_steps':>9} {'float_ops':>9} {'size':>7}")
    for form in FLAGS.forms:
        graph_def, inputs, outputs, int8 = _train(form, tempfile.mkdtemp())
        exports = [("tf-int8", None)]
        choices = int16_choices(graph_def, outputs)
        all16 = [n.name for n in graph_def.node if n.op in _FQ]
        exports += [("aeq-int8", [])] + list(choices.items()) + [("aeq-a16", all16)]
        for label, names in exports:
            reference = graph_def
            try:
                if names is None:
                    model = int8
                else:
                    nodes = {n.name: n for n in graph_def.node}
                    bits = {n: 16 for n in names
                            if edge_quantizer_graphs.reads_input(nodes[n].input[0], nodes)}
                    result = edge_quantizer.mixed_precision_model(
                        graph_def, inputs, outputs, [x[:256]], activation_bits=bits)
                    model, reference = result.model, result.reference_graph_def
                ref = parity.run_graph(reference, inputs[0], outputs[0], xt)
                lite = parity.run_tflite(model, xt)
            except Exception as e:  # pylint: disable=broad-except
                print(f"{form:<18} {label:<11} fails: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:300]}", flush=True)
                continue
            scale = parity._output_scale(int8)  # pylint: disable=protected-access
            report = parity.compare_outputs(ref, lite, scale)
            floats = inspect.find_float_ops(inspect.describe_model(model))
            print(f"{form:<18} {label:<11} {len(names or []):>9} "
                  f"{np.mean(ref.argmax(-1) == yt):>7.2%} {np.mean(lite.argmax(-1) == yt):>7.2%} "
                  f"{report.top1_agreement:>7.2%} {report.max_diff_steps:>9.1f} "
                  f"{len(floats):>9} {len(model):>7}"
                  + (f"  {sorted({f.tflite_op for f in floats})}" if floats else ""), flush=True)


if __name__ == "__main__":
    app.run(main)
