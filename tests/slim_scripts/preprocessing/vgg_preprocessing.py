"""VGG-style preprocessing, in the style of research/slim's preprocessing/vgg_preprocessing.py.

The smallest side is resized (to a random size in [256, 512] when training,
to 256 when evaluating), a crop of the output size is taken (random, or
central), flipped at random when training, and the ImageNet channel means are
subtracted: pixels in [-123.68, 151.06], not rescaled (VGG and ResNet v1 were
trained on them).
"""
import tensorflow.compat.v1 as tf

_R_MEAN = 123.68
_G_MEAN = 116.78
_B_MEAN = 103.94

_RESIZE_SIDE_MIN = 256
_RESIZE_SIDE_MAX = 512


def _smallest_size_at_least(height, width, smallest_side):
  """The size with the smallest side `smallest_side`, aspect kept."""
  smallest_side = tf.cast(smallest_side, tf.float32)
  height = tf.cast(height, tf.float32)
  width = tf.cast(width, tf.float32)
  scale = tf.cond(tf.greater(height, width),
                  lambda: smallest_side / width,
                  lambda: smallest_side / height)
  return (tf.cast(tf.round(height * scale), tf.int32),
          tf.cast(tf.round(width * scale), tf.int32))


def _aspect_preserving_resize(image, smallest_side):
  shape = tf.shape(image)
  new_height, new_width = _smallest_size_at_least(shape[0], shape[1],
                                                  smallest_side)
  image = tf.expand_dims(image, 0)
  image = tf.image.resize_bilinear(image, [new_height, new_width],
                                   align_corners=False)
  image = tf.squeeze(image, [0])
  image.set_shape([None, None, 3])
  return image


def _central_crop(image, height, width):
  shape = tf.shape(image)
  top = (shape[0] - height) // 2
  left = (shape[1] - width) // 2
  return tf.slice(image, [top, left, 0], [height, width, 3])


def _mean_image_subtraction(image, means):
  channels = tf.split(axis=2, num_or_size_splits=3, value=image)
  return tf.concat(axis=2, values=[c - m for c, m in zip(channels, means)])


def preprocess_for_train(image, output_height, output_width,
                         resize_side_min=_RESIZE_SIDE_MIN,
                         resize_side_max=_RESIZE_SIDE_MAX):
  resize_side = tf.random_uniform(
      [], minval=resize_side_min, maxval=resize_side_max + 1, dtype=tf.int32)
  image = _aspect_preserving_resize(tf.cast(image, tf.float32), resize_side)
  image = tf.random_crop(image, [output_height, output_width, 3])
  image.set_shape([output_height, output_width, 3])
  image = tf.image.random_flip_left_right(image)
  return _mean_image_subtraction(image, [_R_MEAN, _G_MEAN, _B_MEAN])


def preprocess_for_eval(image, output_height, output_width, resize_side):
  image = _aspect_preserving_resize(tf.cast(image, tf.float32), resize_side)
  image = _central_crop(image, output_height, output_width)
  image.set_shape([output_height, output_width, 3])
  return _mean_image_subtraction(image, [_R_MEAN, _G_MEAN, _B_MEAN])


def preprocess_image(image, output_height, output_width, is_training=False,
                     resize_side_min=_RESIZE_SIDE_MIN,
                     resize_side_max=_RESIZE_SIDE_MAX, use_grayscale=False):
  """Preprocesses one image for training or evaluation."""
  if use_grayscale:
    image = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
  if is_training:
    return preprocess_for_train(image, output_height, output_width,
                                resize_side_min, resize_side_max)
  return preprocess_for_eval(image, output_height, output_width,
                             resize_side_min)
