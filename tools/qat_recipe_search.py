"""Per-layer sensitivity and a greedy recipe search for a trained quantized Keras model.

  .venv/bin/python tools/qat_recipe_search.py --model=out/qm.keras \
      --eval_data=out/eval.npz --budget=1.0 --output_dir=out/search

--model is a `.keras` file of a model from `qat.quantize_model`, saved after
QAT (`qm.save("qm.keras")`). Instead, --float_model (a float `.keras` model)
with an optional --recipe (the base recipe's JSON) quantizes it here; its
activation ranges are then set by running it on the eval images in training
mode (no optimizer step; batch norms may update their moving statistics on these
images), so the figures are those of a model before QAT.
--eval_data is an .npz holding the eval inputs and integer labels
(--images_key, --labels_key). No candidate is retrained: each is the model
quantized again with its recipe, given the trained ranges, exported to
TFLite and run on the eval set (`qat.search_recipe`).

Writes into --output_dir: recipe.json (the proposal, for
`qat.quantize_model(model, recipe=qat.Recipe.load(...))`), pareto.png (with
matplotlib), sensitivity.txt/.json, search.txt/.json and the candidates'
.tflite files under candidates/; prints the tables. Exit status: 0 done,
1 bad input.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "A .keras file of a trained model from qat.quantize_model.")
flags.DEFINE_string("float_model", None, "A float .keras model (instead of --model).")
flags.DEFINE_string("recipe", None, "With --float_model: the base recipe's JSON file.")
flags.DEFINE_bool("per_channel_weights", True, "With --float_model: per-channel conv weights.")
flags.DEFINE_string("eval_data", None, "An .npz with the eval inputs and labels.")
flags.DEFINE_string("images_key", "images", "The inputs' key in --eval_data.")
flags.DEFINE_string("labels_key", "labels", "The labels' key in --eval_data.")
flags.DEFINE_float("budget", 1.0, "Top-1 points the proposal may lose against all-int8.")
flags.DEFINE_string("output_dir", None, "Where the recipe, plot and tables are written.")
flags.mark_flags_as_required(["eval_data", "output_dir"])


def _quantized_model(keras, images):
    """The trained quantized model: loaded, or the float model quantized here."""
    import qat  # pylint: disable=import-outside-toplevel
    if bool(FLAGS.model) == bool(FLAGS.float_model):
        raise ValueError("give one of --model (a quantized .keras file) or --float_model.")
    if FLAGS.model:
        model = keras.models.load_model(FLAGS.model)
        if not hasattr(model, "quantize_options"):
            raise ValueError(f"--model={FLAGS.model} is not a model from qat.quantize_model; "
                             "pass a float model as --float_model (and --recipe).")
        return model
    recipe = qat.Recipe.load(FLAGS.recipe) if FLAGS.recipe else None
    qm = qat.quantize_model(keras.models.load_model(FLAGS.float_model), recipe=recipe,
                            per_channel_weights=FLAGS.per_channel_weights)
    for start in range(0, len(images), 64):  # Ranges (and batch-norm statistics): no optimizer step.
        qm(images[start:start + 64], training=True)
    return qm


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def main(argv):
    del argv
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    import qat  # pylint: disable=import-outside-toplevel
    from qat import export  # pylint: disable=import-outside-toplevel
    try:
        with np.load(FLAGS.eval_data) as data:
            missing = [k for k in (FLAGS.images_key, FLAGS.labels_key) if k not in data]
            if missing:
                raise ValueError(f"--eval_data={FLAGS.eval_data} has no {missing}; it holds "
                                 f"{sorted(data)} (set --images_key / --labels_key).")
            images = data[FLAGS.images_key].astype(np.float32)
            labels = data[FLAGS.labels_key].astype(np.int64)
        qm = _quantized_model(keras, images)
        os.makedirs(FLAGS.output_dir, exist_ok=True)
        candidates = os.path.join(FLAGS.output_dir, "candidates")
        os.makedirs(candidates, exist_ok=True)
        result = qat.search_recipe(
            qm, images, labels, budget=FLAGS.budget, output_dir=candidates,
            recipe_path=os.path.join(FLAGS.output_dir, "recipe.json"),
            plot_path=_plot_path())
    except (export.ExportError, qat.RecipeError, ValueError, TypeError, OSError) as e:
        logging.error("%s", e)
        return 1
    for name, table in (("sensitivity", result.sensitivity), ("search", result)):
        _write(os.path.join(FLAGS.output_dir, f"{name}.txt"), table.format())
        _write(os.path.join(FLAGS.output_dir, f"{name}.json"), table.to_json())
    print(result.sensitivity.format())
    print(result.format())
    print(f"wrote {os.path.join(FLAGS.output_dir, 'recipe.json')}")
    return 0


def _plot_path():
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        logging.warning("matplotlib is not installed: no pareto.png (pip install matplotlib).")
        return None
    return os.path.join(FLAGS.output_dir, "pareto.png")


if __name__ == "__main__":
    app.run(main)
