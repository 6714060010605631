"""Recurrent models of the digit rows for bench/bench_recurrent.py (issue #38).

The UCI digits (bundled with scikit-learn) read as sequences: each image's 8
rows are 8 steps of 8 features. `run_form` trains one form float, fine-tunes
it with QAT and exports it; `loop_forms` measures a quantized LSTM written
as a `tf.while_loop` against its unrolled form; `int16_conversions` converts
it in TF's 16x8 mode.
"""
import math
import os
import time
from typing import Dict, List

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
STEPS, FEATURES, CLASSES = 8, 8, 10


def digit_rows():
    """((train rows, labels), (test rows, labels)): [n, 8, 8], a fixed split."""
    from sklearn import datasets  # pylint: disable=import-outside-toplevel
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


# --- The graph path: TF1 cells ---------------------------------------------------------

def _tf1_logits(rows, form: str, units: int):
    cells = tf1.nn.rnn_cell
    cell = (cells.GRUCell if "gru" in form else cells.LSTMCell)(units)
    with tf1.variable_scope("net"):
        if "static" in form:
            outputs, _ = tf1.nn.static_rnn(cell, tf.unstack(rows, axis=1), dtype=tf.float32)
            last = outputs[-1]
        else:
            outputs, _ = tf1.nn.dynamic_rnn(cell, rows, dtype=tf.float32)
            last = outputs[:, -1]
        logits = tf1.layers.dense(last, CLASSES, name="logits")
    return tf.identity(logits, name="output")


def _tf1_train(form, units, steps, learning_rate, seed, restore, save, quantized):
    import qat  # pylint: disable=import-outside-toplevel
    (x, y), _ = digit_rows()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        rows = tf1.placeholder(tf.float32, [None, STEPS, FEATURES], name="input")
        labels = tf1.placeholder(tf.int32, [None])
        logits = _tf1_logits(rows, form, units)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        model_variables = tf1.global_variables()
        if quantized:
            qat.experimental_create_training_graph(graph, symmetric_weights=True)
        train = tf1.train.AdamOptimizer(learning_rate).minimize(loss)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if restore:
                tf1.train.Saver(model_variables).restore(sess, restore)
            rng = np.random.RandomState(seed)
            for _ in range(steps):
                batch = rng.randint(0, len(x), 32)
                sess.run(train, {rows: x[batch], labels: y[batch]})
            tf1.train.Saver().save(sess, save)


def _tf1_eval(form, units, checkpoint, quantized):
    import qat  # pylint: disable=import-outside-toplevel
    graph = tf.Graph()
    with graph.as_default():
        rows = tf1.placeholder(tf.float32, [None, STEPS, FEATURES], name="input")
        _tf1_logits(rows, form, units)
        if quantized:
            qat.experimental_create_eval_graph(graph, symmetric_weights=True)
        sess = tf1.Session(graph=graph)
        tf1.train.Saver().restore(sess, checkpoint)
    return sess


def _run_tf1(form, units, float_steps, qat_steps, seed, directory):
    from qat import export  # pylint: disable=import-outside-toplevel
    from qat.export import freeze  # pylint: disable=import-outside-toplevel
    from qat.report import numerics  # pylint: disable=import-outside-toplevel
    if form.endswith("_v1"):
        tf1.disable_control_flow_v2()
    try:
        float_path = os.path.join(directory, "float")
        _tf1_train(form, units, float_steps, 3e-3, seed, None, float_path, quantized=False)
        qat_path = os.path.join(directory, "qat")
        _tf1_train(form, units, qat_steps, 3e-4, seed + 1, float_path, qat_path, quantized=True)
        float_sess = _tf1_eval(form, units, float_path, quantized=False)
        sess = _tf1_eval(form, units, qat_path, quantized=True)
    finally:
        if form.endswith("_v1"):
            tf1.enable_control_flow_v2()
    _, (xt, yt) = digit_rows()
    float_accuracy = _accuracy(float_sess.run("output:0", {"input:0": xt}), yt)
    qat_accuracy = _accuracy(sess.run("output:0", {"input:0": xt}), yt)
    results = export.export_tflite(["input"], ["output"], directory, sess=sess,
                                   flavours=("uint8", "int8"), parity_inputs=xt,
                                   require_integer=False)
    frozen = freeze.freeze_session(sess, ["output"])
    rows = []
    for flavour, result in results.items():
        report = numerics.layer_numerics(frozen, "input", ["output"], xt, flavour=flavour,
                                         model=result.model)
        rows.append(_row(flavour, float_accuracy, qat_accuracy, result, report, xt, yt))
    return rows


# --- The TF 2 path: Keras 3 layers -----------------------------------------------------

def _keras_model(form: str, units: int):
    import keras  # pylint: disable=import-outside-toplevel
    layers = keras.layers
    inputs = keras.Input((STEPS, FEATURES), name="rows")
    if form == "k3_bidirectional":
        h = layers.Bidirectional(layers.LSTM(units, return_sequences=True))(inputs)
        h = layers.Bidirectional(layers.LSTM(units, return_sequences=True))(h)
        logits = layers.GlobalAveragePooling1D()(layers.Dense(CLASSES)(h))
        return keras.Model(inputs, logits)
    kind = form.split("_")[1]
    layer = {"lstm": layers.LSTM, "gru": layers.GRU, "simple": layers.SimpleRNN}[kind]
    h = layer(units, unroll=form.endswith("_unroll"))(inputs)
    return keras.Model(inputs, layers.Dense(CLASSES)(h))


def _keras_train(model, steps, learning_rate, seed, training=None):
    import keras  # pylint: disable=import-outside-toplevel
    (x, y), _ = digit_rows()
    optimizer = keras.optimizers.Adam(learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    call = {} if training is None else {"training": training}

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, **call))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    rng = np.random.RandomState(seed)
    for _ in range(steps):
        batch = rng.randint(0, len(x), 32)
        step(x[batch], y[batch])


def _run_keras(form, units, float_steps, qat_steps, seed, directory):
    import keras  # pylint: disable=import-outside-toplevel
    import qat  # pylint: disable=import-outside-toplevel
    from qat import export  # pylint: disable=import-outside-toplevel
    from qat.report import tf2_models  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(seed)
    model = _keras_model(form, units)
    _keras_train(model, float_steps, 3e-3, seed)
    _, (xt, yt) = digit_rows()
    float_accuracy = _accuracy(model(xt), yt)
    qm = qat.quantize_model(model)
    _keras_train(qm, qat_steps, 3e-4, seed + 1, training=True)
    qat_accuracy = _accuracy(qm(xt, training=False), yt)
    result = export.export_model(qm, directory, name=form, parity_inputs=xt,
                                 require_integer=False)
    report = tf2_models.layer_numerics_of_model(qm, xt, tflite=result.model)
    return [_row("int8", float_accuracy, qat_accuracy, result, report, xt, yt)]


def run_form(form: str, units: int, float_steps: int, qat_steps: int, seed: int,
             directory: str) -> List[Dict]:
    """Trains, fine-tunes and exports one form; one dict per flavour."""
    run = _run_keras if form.startswith("k3_") else _run_tf1
    return run(form, units, float_steps, qat_steps, seed, directory)


def _accuracy(logits, labels) -> float:
    return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def _row(flavour, float_accuracy, qat_accuracy, result, report, xt, yt) -> Dict:
    from qat.export import inspect  # pylint: disable=import-outside-toplevel
    from qat.export import parity  # pylint: disable=import-outside-toplevel
    own = [r.max_own_steps for r in report.rows if not math.isnan(r.max_own_steps)]
    return {"flavour": flavour, "float": float_accuracy, "qat": qat_accuracy,
            "tflite": _accuracy(parity.run_tflite(result.model, xt), yt),
            "agreement": result.parity.top1_agreement,
            "float_ops": len(inspect.find_float_ops(result.report)),
            "own_steps": max(own) if own else math.nan, "size": result.size_bytes}


# --- A WHILE loop against its unrolled form --------------------------------------------

def _quantized_lstm(steps: int, units: int):
    """(unrolled, looped, rng): one LSTM of `units` units over `steps` steps
    with 8-bit FakeQuant ops where qat puts them, written unrolled and as a
    `tf.while_loop` (functions of [batch, steps, features] inputs)."""
    rng = np.random.RandomState(0)
    kernel = rng.normal(0, 0.3, (FEATURES, 4 * units)).astype(np.float32)
    recurrent = rng.normal(0, 0.3, (units, 4 * units)).astype(np.float32)
    bias = rng.normal(0, 0.1, (4 * units,)).astype(np.float32)

    def fq(t, lo, hi):
        return tf.quantization.fake_quant_with_min_max_args(t, lo, hi)

    def weights(w):
        m = float(np.abs(w).max())
        return tf.quantization.fake_quant_with_min_max_args(tf.constant(w), -m, m,
                                                            narrow_range=True)

    def cell(x_t, h, c):
        z = fq(fq(tf.matmul(x_t, weights(kernel)), -8, 8)
               + fq(tf.matmul(h, weights(recurrent)), -8, 8), -8, 8)
        i, f, g, o = tf.split(fq(z + bias, -8, 8), 4, axis=1)
        gate = lambda t: fq(tf.sigmoid(t), 0, 255 / 256)  # pylint: disable=unnecessary-lambda-assignment
        c = fq(fq(gate(f) * c, -4, 4) + fq(gate(i) * fq(tf.tanh(g), -1, 127 / 128), -1, 1), -4, 4)
        return fq(gate(o) * fq(tf.tanh(c), -1, 127 / 128), -1, 1), c

    def states(x):
        batch = tf.shape(x)[0]
        return (tf.fill([batch, units], fq(tf.constant(0.0), -1, 1)),
                tf.fill([batch, units], fq(tf.constant(0.0), -4, 4)))

    def unrolled(x):
        x = fq(x, 0, 1)
        h, c = states(x)
        for t in range(steps):
            h, c = cell(x[:, t], h, c)
        return h

    def looped(x):
        x = fq(x, 0, 1)
        h, c = states(x)

        def body(t, h, c):
            h, c = cell(tf.gather(x, t, axis=1), fq(h, -1, 1), fq(c, -4, 4))
            return t + 1, h, c
        _, h, _ = tf.while_loop(lambda t, h, c: t < steps, body, (tf.constant(0), h, c))
        return h

    return unrolled, looped, rng


def loop_forms(steps: int, units: int) -> List[str]:
    """One quantized LSTM, unrolled and as a while loop, converted (see the bench)."""
    from qat.export import inspect  # pylint: disable=import-outside-toplevel
    unrolled, looped, rng = _quantized_lstm(steps, units)
    lines = []
    samples = rng.uniform(0, 1, (256, steps, FEATURES)).astype(np.float32)
    for name, fn in (("unrolled", unrolled), ("while", looped)):
        for batch in (1, None):
            function = tf.function(fn, input_signature=[tf.TensorSpec([batch, steps, FEATURES])])
            concrete = function.get_concrete_function()
            converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.inference_input_type = tf.int8
            model = converter.convert()
            report = inspect.describe_model(model)
            floats = [f.tflite_op for f in inspect.find_float_ops(report)]
            count = batch or 256
            interpreter = inspect.make_interpreter(model)
            details = interpreter.get_input_details()[0]
            interpreter.resize_tensor_input(details["index"], [count, steps, FEATURES])
            interpreter.allocate_tensors()
            scale, zero = details["quantization"]
            interpreter.set_tensor(details["index"], np.clip(
                np.round(samples[:count] / scale + zero), -128, 127).astype(np.int8))
            interpreter.invoke()
            start = time.perf_counter()
            for _ in range(20):
                interpreter.invoke()
            seconds = (time.perf_counter() - start) / 20
            out = interpreter.get_output_details()[0]
            value = interpreter.get_tensor(out["index"]).astype(np.float32)
            if out["dtype"] != np.float32:
                value = (value - out["quantization"][1]) * out["quantization"][0]
            diff = np.abs(value - concrete(tf.constant(samples[:count])).numpy()).max()
            lines.append(
                f"{steps} steps, {name:<8} batch {count:>3}: {len(model):>7} bytes, float ops "
                f"{floats or 'none'}, invoke {seconds * 1e3:.2f} ms, max |TFLite - TF| "
                f"{diff / (2 / 255):.0f} output steps")
    return lines


def int16_conversions(steps: int, units: int) -> List[str]:
    """The unrolled quantized LSTM of `loop_forms` (8-bit FakeQuant ops, as qat
    makes them) converted in TF's 16x8 mode (int16 activations, int8 weights),
    without and with a representative dataset: what the converter says."""
    unrolled, _, rng = _quantized_lstm(steps, units)
    samples = rng.uniform(0, 1, (16, steps, FEATURES)).astype(np.float32)
    concrete = tf.function(unrolled, input_signature=[
        tf.TensorSpec([1, steps, FEATURES])]).get_concrete_function()
    lines = []
    for representative in (False, True):
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        if representative:
            converter.representative_dataset = lambda: ([samples[k:k + 1]] for k in range(16))
        label = f"16x8, {'a' if representative else 'no'} representative dataset:"
        try:
            model = converter.convert()
        except Exception as e:  # pylint: disable=broad-except
            errors = sorted({line.split("error: ", 1)[1] for line in str(e).splitlines()
                             if "error: " in line})
            lines.append(f"{label} conversion fails: {'; '.join(errors) or str(e)[-300:]}")
            continue
        lines.append(f"{label} converts ({len(model)} bytes)")
    return lines
