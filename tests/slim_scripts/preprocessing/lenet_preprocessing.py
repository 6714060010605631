"""LeNet preprocessing, in the style of research/slim's preprocessing/lenet_preprocessing.py.

The image cropped or padded to the output size, then (x - 128) / 128: pixels
in [-1, 127/128].
"""
import tensorflow.compat.v1 as tf


def preprocess_image(image, output_height, output_width, is_training=False,
                     use_grayscale=False):
  del is_training  # Training and evaluation preprocess alike.
  if use_grayscale:
    image = tf.image.rgb_to_grayscale(image)
  image = tf.cast(image, tf.float32)
  image = tf.image.resize_image_with_crop_or_pad(image, output_width,
                                                 output_height)
  image = tf.subtract(image, 128.0)
  return tf.div(image, 128.0)
