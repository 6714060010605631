"""CifarNet preprocessing, in the style of research/slim's preprocessing/cifarnet_preprocessing.py.

Training: padded by 4 pixels, a random crop of the output size, a random
flip, random brightness and contrast. Evaluation: cropped or padded to the
output size. Both end with per-image standardization (zero mean, unit
variance per image).
"""
import tensorflow.compat.v1 as tf

_PADDING = 4


def preprocess_for_train(image, output_height, output_width,
                         padding=_PADDING):
  image = tf.cast(image, tf.float32)
  if padding > 0:
    image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
  distorted_image = tf.random_crop(image, [output_height, output_width, 3])
  distorted_image = tf.image.random_flip_left_right(distorted_image)
  distorted_image = tf.image.random_brightness(distorted_image, max_delta=63)
  distorted_image = tf.image.random_contrast(distorted_image, lower=0.2,
                                             upper=1.8)
  return tf.image.per_image_standardization(distorted_image)


def preprocess_for_eval(image, output_height, output_width):
  image = tf.cast(image, tf.float32)
  resized_image = tf.image.resize_image_with_crop_or_pad(image, output_width,
                                                         output_height)
  return tf.image.per_image_standardization(resized_image)


def preprocess_image(image, output_height, output_width, is_training=False,
                     use_grayscale=False):
  """Preprocesses one image for training or evaluation."""
  if use_grayscale:
    image = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
  if is_training:
    return preprocess_for_train(image, output_height, output_width)
  return preprocess_for_eval(image, output_height, output_width)
