"""Writes a tiny ImageNet-format TFRecord dataset for tests/slim_scripts_test.py.

tf.Example protos with ImageNet's keys, as research/slim's
build_imagenet_data.py wrote them: JPEG-encoded 32x32 RGB images, labels 1..4
(0 is ImageNet's background class). Each class has its own colour and
stripe orientation, so a few steps of training separate them.
"""
import os

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
