"""What qat did to a graph: coverage and per-layer numerics, as text, JSON and plots.

  .venv/bin/python tools/qat_report.py --graph=out/demo/eval_graph.meta \
      --checkpoint=out/demo/checkpoints/qat --outputs=probabilities \
      --inputs=images --samples=out/demo/test_images.npy --output_dir=out/report

Coverage (always): every layer with its batch norm (folded or why not), its
weight quantizer and activation quantizer, every quantizer with its range
(values from the checkpoint), every tensor left float with the reason.
Numerics (with --samples): the float model (FakeQuants bypassed), the eval
graph and the TFLite model run on the samples; per layer the SQNR of QAT vs
float and of TFLite vs the eval graph, the difference in quantization steps
and the first layer where TFLite drifts by more than one step.

Writes report.txt, report.json and (with matplotlib) sqnr.png into
--output_dir and prints the text report. Exit status: 0 done, 1 bad input.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string("graph", None, "Rewritten graph file: .meta, .pb or .pbtxt.")
flags.DEFINE_string("checkpoint", None, "Checkpoint prefix or directory (range values).")
flags.DEFINE_list("outputs", None, "Output op names of the inference graph.")
flags.DEFINE_list("inputs", ["input"], "The input placeholder(s) (numerics).")
flags.DEFINE_string("scope", None, "The scope the rewrite was given, if any.")
flags.DEFINE_string("samples", None, ".npy file of inputs (examples first), or .npz file "
                    "with one array per input named after it (integer ids and masks fed as "
                    "they are): enables the per-layer numerics.")
flags.DEFINE_integer("max_samples", 256, "Use at most this many samples.")
flags.DEFINE_enum("flavour", "uint8", ["uint8", "int8"], "TFLite model of the numerics.")
flags.DEFINE_list("input_range", None,
                  "MIN,MAX of the float inputs no FakeQuant reads (integer inputs need none).")
flags.DEFINE_string("output_dir", "out/report", "Where report.txt/json and plots go.")
flags.DEFINE_bool("plots", True, "Draw PNG plots (needs matplotlib).")
flags.mark_flags_as_required(["graph", "outputs"])


def main(argv):
    del argv
    from qat import report  # pylint: disable=g-import-not-at-top
    from qat import export  # pylint: disable=g-import-not-at-top
    from qat.export import ExportError  # pylint: disable=g-import-not-at-top
    try:
        coverage = report.coverage_report_from_files(FLAGS.graph, FLAGS.checkpoint,
                                                     outputs=FLAGS.outputs, scope=FLAGS.scope)
        numerics = None
        if FLAGS.samples:
            samples = export.load_inputs(FLAGS.samples, FLAGS.inputs, FLAGS.max_samples)
            input_range = (tuple(float(v) for v in FLAGS.input_range)
                           if FLAGS.input_range else None)
            numerics = report.layer_numerics_from_files(
                FLAGS.graph, FLAGS.checkpoint, FLAGS.inputs, FLAGS.outputs, samples,
                flavour=FLAGS.flavour, input_range=input_range)
    except (ExportError, ValueError, OSError) as e:
        logging.error("%s", e)
        return 1
    paths = report.write_reports(FLAGS.output_dir, coverage, numerics, plots=FLAGS.plots)
    print(coverage.format())
    if numerics is not None:
        print()
        print(numerics.format())
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    app.run(main)
