"""Exports a qat eval graph to fully integer TFLite models (uint8 and/or int8).

  .venv/bin/python tools/export_tflite.py --graph=eval.meta --checkpoint=ckpt/model.ckpt-500 \
      --inputs=input --outputs=logits --input_range=0,1 --output_dir=out/tflite --parity=random

The graph is an eval graph (after qat.create_eval_graph): a MetaGraphDef (.meta)
or a GraphDef (.pb binary, .pbtxt text) with a checkpoint, or a frozen GraphDef.
Every model is checked to be fully integer (a float op left over is an error
naming the TF op that had no range); --parity compares the models with the
graph on random or given inputs. Integer inputs (token ids, masks) stay
integer inputs of the model and need no --input_range.

--converter=saved_model writes <output_dir>/<name>_saved_model, a TF 2
SavedModel with a serving_default signature (TF Serving loads it), and converts
it with TF 2's tf.lite.TFLiteConverter.from_saved_model (int8 only).

Exit status: 0 done; 1 bad input or a model not fully integer; 3 a parity
threshold missed with --fail_on_parity.
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string("graph", None, "Eval graph file: .meta, .pb or .pbtxt.")
flags.DEFINE_string("checkpoint", None,
                    "Checkpoint prefix or directory (not needed for a frozen graph).")
flags.DEFINE_list("inputs", ["input"], "Input tensor names.")
flags.DEFINE_list("outputs", None, "Output tensor names.")
flags.DEFINE_enum("flavour", "both", ["uint8", "int8", "both"],
                  "Which TFLite model(s); with --converter=saved_model, int8 ('both' means int8).")
flags.DEFINE_enum("converter", "session", ["session", "saved_model"],
                  "'session': TF1's converter on the frozen graph; 'saved_model': write a TF 2 "
                  "SavedModel (<output_dir>/<name>_saved_model) and convert it with TF 2's "
                  "TFLiteConverter.from_saved_model (int8 only).")
flags.DEFINE_string("output_dir", "out/tflite", "Directory for <name>_<flavour>.tflite.")
flags.DEFINE_string("name", "model", "File name stem of the models.")
flags.DEFINE_list("input_range", None,
                  "MIN,MAX of the real input values (all float inputs; integer inputs such "
                  "as token ids and masks need none). Default: the range of a FakeQuant "
                  "reading the input, if there is one.")
flags.DEFINE_bool("int8_io", False, "int8 instead of float input/output for the int8 model.")
flags.DEFINE_bool("allow_float", False,
                  "Write models that still hold float ops instead of failing.")
flags.DEFINE_bool("allow_lost_ranges", False,
                  "Export even when an activation range of the graph is no tensor of the "
                  "model with its scale and zero point (warn instead of exiting 1).")
flags.DEFINE_bool("list_ops", False, "Print every operator with its tensor types.")
flags.DEFINE_string("parity", "none",
                    "'none', 'random', a .npy file of the first input's examples, or a .npz "
                    "file with one array per input named after it (examples first).")
flags.DEFINE_integer("parity_examples", 256, "Number of random parity inputs.")
flags.DEFINE_integer("parity_int_high", 2,
                     "Random parity values of integer inputs (ids, masks) are in "
                     "[0, parity_int_high).")
flags.DEFINE_integer("seed", 0, "Seed of the random parity inputs.")
flags.DEFINE_float("min_agreement", 99.0, "Parity threshold: top-1 agreement in percent.")
flags.DEFINE_float("max_diff_steps", None,
                   "Parity threshold: largest output difference in quantization steps.")
flags.DEFINE_bool("fail_on_parity", False, "Exit with status 3 when a parity threshold is missed.")
flags.mark_flags_as_required(["graph", "outputs"])


def _input_shape(graph_def, name):
    from qat.export.freeze import op_name  # pylint: disable=g-import-not-at-top
    for node in graph_def.node:
        if node.name == op_name(name) and "shape" in node.attr:
            dims = [d.size for d in node.attr["shape"].shape.dim]
            if dims and all(d > 0 for d in dims[1:]):
                return dims[1:]
    return None


def _input_dtype(graph_def, name):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from qat.export.freeze import op_name  # pylint: disable=g-import-not-at-top
    for node in graph_def.node:
        if node.name == op_name(name) and "dtype" in node.attr:
            return tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype
    return np.float32


def _parity_inputs(graph_def, input_range):
    from qat import export  # pylint: disable=g-import-not-at-top
    if FLAGS.parity == "none":
        return None
    if FLAGS.parity != "random":
        return export.load_inputs(FLAGS.parity, FLAGS.inputs)
    lo, hi = input_range if input_range else (0.0, 1.0)
    rng = np.random.RandomState(FLAGS.seed)
    inputs = {}
    for name in FLAGS.inputs:
        shape = _input_shape(graph_def, name)
        if shape is None:
            raise ValueError(f"input {name!r} has no fully known shape past the batch "
                             "dimension: give parity inputs as a file (--parity=FILE)")
        shape = [FLAGS.parity_examples] + shape
        if export.is_float_input(graph_def, name):
            inputs[name] = rng.uniform(lo, hi, shape).astype(np.float32)
        else:  # Ids, masks: small integers, valid for any table.
            inputs[name] = rng.randint(0, FLAGS.parity_int_high, shape).astype(
                _input_dtype(graph_def, name))
    return inputs if len(inputs) > 1 else inputs[FLAGS.inputs[0]]


def main(argv):
    del argv
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from qat import export  # pylint: disable=g-import-not-at-top
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")  # TF1 deprecation notices of the freezing APIs.

    input_range = None
    if FLAGS.input_range:
        try:
            input_range = tuple(float(v) for v in FLAGS.input_range)
            if len(input_range) != 2:
                raise ValueError
        except ValueError:
            logging.error("--input_range must be MIN,MAX (two numbers), got %s",
                          ",".join(FLAGS.input_range))
            return 1
    flavours = ["uint8", "int8"] if FLAGS.flavour == "both" else [FLAGS.flavour]
    if FLAGS.converter == "saved_model" and FLAGS.flavour == "both":
        flavours = ["int8"]
    try:
        start = time.perf_counter()
        logging.info("freezing %s with checkpoint %s", FLAGS.graph, FLAGS.checkpoint)
        frozen = export.freeze_graph_file(FLAGS.graph, FLAGS.checkpoint, FLAGS.outputs)
        export.check_tensor_names(frozen, FLAGS.inputs, "input")
        parity_inputs = _parity_inputs(frozen, input_range)
        logging.info("converting %s", ", ".join(flavours))
        results = export.export_tflite(
            FLAGS.inputs, FLAGS.outputs, FLAGS.output_dir, frozen_graph_def=frozen,
            flavours=flavours, name=FLAGS.name,
            input_ranges=({n: input_range for n in FLAGS.inputs
                           if export.is_float_input(frozen, n)} if input_range else None),
            int8_io=FLAGS.int8_io, require_integer=not FLAGS.allow_float,
            allow_lost_ranges=FLAGS.allow_lost_ranges,
            parity_inputs=parity_inputs, converter=FLAGS.converter)
    except (export.ExportError, ValueError) as e:
        logging.error("%s", e)
        return 1
    failed = []
    for flavour, result in results.items():
        float_ops = export.find_float_ops(result.report, frozen)
        status = "fully integer" if not float_ops else f"{len(float_ops)} FLOAT OP(S)"
        print(f"{flavour}: {result.path}  {result.size_bytes} bytes  {status}  "
              f"ops {result.report.op_counts()}  converted in {result.convert_seconds:.2f} s")
        if result.saved_model_dir:
            print(f"  converted from the SavedModel {result.saved_model_dir}")
        for f in float_ops:
            print(f"  {f.describe()}")
        if FLAGS.list_ops:
            print(result.report.format())
        if result.parity is not None:
            misses = export.parity_failures(
                result.parity, FLAGS.min_agreement / 100.0, FLAGS.max_diff_steps)
            print(f"  parity: {result.parity.format()}"
                  + (f"  FAILED: {'; '.join(misses)}" if misses else "  ok"))
            if misses:
                failed.append(flavour)
    print(f"done in {time.perf_counter() - start:.1f} s")
    if failed and FLAGS.fail_on_parity:
        logging.error("parity thresholds missed by: %s", ", ".join(failed))
        return 3
    return 0


if __name__ == "__main__":
    app.run(main)
