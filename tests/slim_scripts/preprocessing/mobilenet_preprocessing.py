"""Inception-style preprocessing, reduced: scale to [-1, 1], resize, flip."""
import tensorflow.compat.v1 as tf


def preprocess_image(image, height, width, is_training=False,
                     use_grayscale=False):
  """Preprocesses one image tensor of any size into [height, width, 3] in [-1, 1]."""
  if image.dtype != tf.float32:
    image = tf.image.convert_image_dtype(image, dtype=tf.float32)
  if use_grayscale:
    image = tf.image.rgb_to_grayscale(image)
  image = tf.expand_dims(image, 0)
  image = tf.image.resize_bilinear(image, [height, width], align_corners=False)
  image = tf.squeeze(image, [0])
  if is_training:
    image = tf.image.random_flip_left_right(image)
  image = tf.subtract(image, 0.5)
  image = tf.multiply(image, 2.0)
  return image
