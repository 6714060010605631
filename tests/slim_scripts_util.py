"""The TFRecord dataset and the command runner of tests/slim_scripts_test.py.

tf.Example protos with ImageNet's keys, as research/slim's
build_imagenet_data.py wrote them: JPEG-encoded 32x32 RGB images, labels 1..4
(0 is ImageNet's background class). Each class has its own colour and
stripe orientation, so a few steps of training separate them.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

NUM_CLASSES = 5  # datasets/imagenet.py's _NUM_CLASSES: background + 4.
SPLITS = {"train": 64, "validation": 32}


def _image(label: int, rng: np.random.RandomState, size: int) -> np.ndarray:
    image = rng.uniform(0, 80, (size, size, 3))
    image[..., (label - 1) % 3] += 150
    stripes = (np.arange(size) // 4) % 2 == 0
    if label <= 2:
        image[stripes, :, :] += 25
    else:
        image[:, stripes, :] += 25
    return np.clip(image, 0, 255).astype(np.uint8)


def _feature(value) -> tf.train.Feature:
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def write_dataset(dataset_dir: str, size: int = 32, seed: int = 0) -> None:
    """Writes train-00000-of-00001 and validation-00000-of-00001 under dataset_dir."""
    rng = np.random.RandomState(seed)
    os.makedirs(dataset_dir, exist_ok=True)
    for split, count in SPLITS.items():
        path = os.path.join(dataset_dir, f"{split}-00000-of-00001")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(count):
                label = 1 + i % (NUM_CLASSES - 1)
                encoded = tf.io.encode_jpeg(_image(label, rng, size), quality=95).numpy()
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image/encoded": _feature(encoded),
                    "image/format": _feature(b"jpeg"),
                    "image/class/label": _feature(label),
                    "image/class/text": _feature(f"class{label}".encode()),
                    "image/height": _feature(size),
                    "image/width": _feature(size),
                }))
                writer.write(example.SerializeToString())


# --- Running the scripts -----------------------------------------------------

# The warm interpreter: TensorFlow, tf_keras, qat and TF's two tools imported
# once (about 5 s a process on this machine); each command then runs in a
# process forked from it, as `python script args` / `python -m module args`
# would: its own sys.argv, flags, graphs and sessions, its `__main__`, its exit
# status. tf_slim is not imported here: each script's install line enables it.
_WARM_SOURCE = r'''
import json, os, resource, runpy, sys, time, traceback
import tensorflow, tf_keras, qat, qat.compat
from tensorflow.lite.python import tflite_convert
from tensorflow.python.tools import freeze_graph

def _child(argv, log, cwd):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

for line in sys.stdin:
    request = json.loads(line)
    start = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            _child(request["argv"], request["log"], request["cwd"])
        finally:
            os._exit(1)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status),
                      "wall_s": time.time() - start,
                      "cpu_s": usage.ru_utime + usage.ru_stime,
                      "max_rss_mb": usage.ru_maxrss / 1024.0}), flush=True)
'''


class ScriptError(AssertionError):
    """A command exited with a non-zero status; the message ends with its output."""


class ScriptRunner:
    """Runs research/slim's scripts and TF's tools, each in its own process.

    The processes fork from one warm interpreter (started once, _WARM_SOURCE)
    instead of importing TensorFlow each time; `run` returns the command's
    output and records its wall and CPU seconds and peak memory in `timings`.
    """

    def __init__(self, pythonpath, workdir: str):
        self.workdir = workdir
        self.timings = []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            list(pythonpath) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["TF_USE_LEGACY_KERAS"] = "1"
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        self._count = 0
        self._log = os.path.join(workdir, "warm_interpreter.log")
        with open(self._log, "w") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _WARM_SOURCE], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=env, cwd=workdir, text=True)

    def run(self, args, label: str = "") -> str:
        """Runs `python *args`; raises ScriptError with the output on failure."""
        self._count += 1
        log = os.path.join(self.workdir, "command_%03d.log" % self._count)
        request = {"argv": [str(a) for a in args], "log": log, "cwd": self.workdir}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._process.stdout.readline()
        output = ""
        if os.path.exists(log):
            with open(log) as f:
                output = f.read()
        if not reply:
            with open(self._log) as f:
                warm = f.read()
            raise ScriptError(f"the warm interpreter died running {' '.join(args)}:\n"
                              f"{output[-3000:]}\n{warm[-3000:]}")
        result = json.loads(reply)
        result["label"] = label or os.path.basename(str(args[1] if args[0] == "-m" else args[0]))
        self.timings.append(result)
        if result["rc"] != 0:
            raise ScriptError(f"{' '.join(str(a) for a in args)} failed ({result['rc']}):\n"
                              f"{output[-6000:]}")
        return output

    def close(self):
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=60)


def freeze(runner: ScriptRunner, graph_path: str, checkpoint: str, output: str,
           frozen_path: str, load: bool = True):
    """TF's freeze_graph tool, as users run it; returns the frozen GraphDef (None: not loaded)."""
    runner.run(["-m", "tensorflow.python.tools.freeze_graph", f"--input_graph={graph_path}",
                "--input_binary=true", f"--input_checkpoint={checkpoint}",
                f"--output_graph={frozen_path}", f"--output_node_names={output}"],
               label="freeze_graph")
    if not load:
        return None
    frozen = tf.compat.v1.GraphDef()
    with open(frozen_path, "rb") as f:
        frozen.ParseFromString(f.read())
    return frozen


def convert_uint8(runner: ScriptRunner, frozen_path: str, tflite_path: str, output: str,
                  image_size: int, mean: float, std: float) -> bytes:
    """`tflite_convert --enable_v1_converter` with TF1's uint8 flags; returns the model."""
    runner.run(["-m", "tensorflow.lite.python.tflite_convert", "--enable_v1_converter",
                f"--graph_def_file={frozen_path}", f"--output_file={tflite_path}",
                "--input_arrays=input", f"--output_arrays={output}",
                f"--input_shapes=1,{image_size},{image_size},3",
                "--inference_type=QUANTIZED_UINT8", f"--mean_values={mean}",
                f"--std_dev_values={std}"], label="tflite_convert")
    with open(tflite_path, "rb") as f:
        return f.read()


def strict_restore(graph_path: str, checkpoint: str) -> int:
    """Restores every variable of the exported GraphDef from `checkpoint` with a plain Saver.

    Returns the number of variables; raises NotFoundError naming the first
    variable the checkpoint lacks.
    """
    tf1 = tf.compat.v1
    graph_def = tf1.GraphDef()
    with open(graph_path, "rb") as f:
        graph_def.ParseFromString(f.read())
    with tf.Graph().as_default() as graph:
        tf1.import_graph_def(graph_def, name="")
        variables = {op.name: op.outputs[0] for op in graph.get_operations()
                     if op.type in ("VariableV2", "VarHandleOp")}
        saver = tf1.train.Saver(variables)
        with tf1.Session(graph=graph) as sess:
            saver.restore(sess, checkpoint)
    return len(variables)


def _load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_images(dataset_dir: str, preprocessing_path: str, size: int, count: int) -> np.ndarray:
    """The first `count` validation images through a preprocessing module's eval path."""
    tf1 = tf.compat.v1
    module = _load_module(preprocessing_path, "_slim_" + os.path.basename(preprocessing_path)[:-3])
    path = os.path.join(dataset_dir, "validation-00000-of-00001")
    encoded = [r.numpy() for r in tf.data.TFRecordDataset(path).take(count)]
    images = []
    with tf.Graph().as_default():
        data = tf1.placeholder(tf.string, [])
        example = tf1.parse_single_example(data, {"image/encoded": tf1.FixedLenFeature((), tf.string)})
        image = tf.image.decode_jpeg(example["image/encoded"], channels=3)
        processed = module.preprocess_image(image, size, size, is_training=False)
        with tf1.Session() as sess:
            for record in encoded:
                images.append(sess.run(processed, {data: record}))
    return np.stack(images).astype(np.float32)


# Given TFLite's own inputs, a uint8 kernel and the frozen graph differ only
# where a value lies within float rounding of a rounding boundary: one step
# (zoo_util.MAX_OWN_STEPS).
MAX_OWN_STEPS = 1.0 + 1e-3


def layer_agreement(model: bytes, frozen: tf.compat.v1.GraphDef, output: str,
                    images: np.ndarray):
    """qat.report's per-layer numerics of `model` against the frozen graph.

    Returns (numerics, checked rows): the checked rows are the matched integer
    TFLite tensors after the model input, each with `max_own_steps`, its
    difference given TFLite's values of the rows before it.
    """
    from qat import report  # pylint: disable=g-import-not-at-top
    numerics = report.layer_numerics(frozen, "input:0", [output], images, flavour="uint8",
                                     model=model, batch_size=1)
    checked = [r for r in numerics.rows
               if r.tflite_tensor is not None and not np.isnan(r.max_own_steps)
               and r.tflite_tensor != "input"]
    return numerics, checked


def hard_swish_margin(model: bytes) -> float:
    """The smallest s_out / (s_in / 128) over the model's HARD_SWISH ops (inf: none).

    TFLite's integer HARD_SWISH refuses to prepare unless it is above 1.
    """
    from qat.export.inspect import make_interpreter  # pylint: disable=g-import-not-at-top
    interp = make_interpreter(model)
    scales = {t["index"]: t["quantization"][0] for t in interp.get_tensor_details()}
    margins = [scales[op["outputs"][0]] / (scales[op["inputs"][0]] / 128.0)
               for op in interp._get_ops_details()  # pylint: disable=protected-access
               if op["op_name"] == "HARD_SWISH" and scales[op["inputs"][0]] > 0]
    return min(margins) if margins else float("inf")
# Those one-step differences add up through a network, most where a layer's
# gain is high: the zoo's bound end to end (zoo_util.MAX_DIFF_STEPS, ResNet50V2
# measured at 13 steps), for the models' outputs against the frozen graph.
MAX_DIFF_STEPS = 24.0


def coarse_accumulator_tensors(model: bytes) -> dict:
    """{TFLite output tensor: s_in * s_w / s_out} of the layers where that exceeds 1.

    There one step of the int32 accumulator (its bias included, which TFLite
    rounds to that step and the eval graph adds in float) is more than one
    output step, so the layer cannot agree within a step given TFLite's
    inputs. It happens after a few steps of training, where the eval graph
    folds batch norms with moving statistics that are still near their
    initial values (ResNet v1 50's conv1, 148 here) while the ranges were
    learned on the batch statistics.
    """
    from qat.export.inspect import make_interpreter  # pylint: disable=g-import-not-at-top
    interp = make_interpreter(model)
    details = {t["index"]: t for t in interp.get_tensor_details()}
    found = {}
    for op in interp._get_ops_details():  # pylint: disable=protected-access
        if op["op_name"] not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            continue
        s_in, s_w, s_out = (details[i]["quantization"][0]
                            for i in (op["inputs"][0], op["inputs"][1], op["outputs"][0]))
        if s_out > 0 and s_in * s_w / s_out > 1.0:
            found[details[op["outputs"][0]]["name"]] = s_in * s_w / s_out
    return found
