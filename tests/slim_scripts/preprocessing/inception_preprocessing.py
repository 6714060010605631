"""Inception-style preprocessing, in the style of research/slim's preprocessing/inception_preprocessing.py.

Training: a random crop covering 5-100% of the image (sample_distorted_bounding_box),
resized to the output size, a random left-right flip and brightness and
saturation distortions. Evaluation: the central 87.5% resized. Both return
pixels in [-1, 1].
"""
import tensorflow.compat.v1 as tf


def distorted_bounding_box_crop(image, bbox, min_object_covered=0.1,
                                aspect_ratio_range=(0.75, 1.33),
                                area_range=(0.05, 1.0), max_attempts=100,
                                scope=None):
  """A random crop of `image` overlapping `bbox`; returns (crop, its box)."""
  with tf.name_scope(scope, 'distorted_bounding_box_crop', [image, bbox]):
    begin, size, distort_bbox = tf.image.sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=bbox,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range, area_range=area_range,
        max_attempts=max_attempts, use_image_if_no_bounding_boxes=True)
    return tf.slice(image, begin, size), distort_bbox


def distort_color(image, scope=None):
  """Random brightness and saturation (the fast mode), clipped to [0, 1]."""
  with tf.name_scope(scope, 'distort_color', [image]):
    image = tf.image.random_brightness(image, max_delta=32. / 255.)
    image = tf.image.random_saturation(image, lower=0.5, upper=1.5)
    return tf.clip_by_value(image, 0.0, 1.0)


def preprocess_for_train(image, height, width, bbox=None, scope=None):
  """A distorted crop of `image`, [height, width, 3] in [-1, 1]."""
  with tf.name_scope(scope, 'distort_image', [image, height, width, bbox]):
    if bbox is None:
      bbox = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32,
                         shape=[1, 1, 4])
    if image.dtype != tf.float32:
      image = tf.image.convert_image_dtype(image, dtype=tf.float32)
    distorted_image, _ = distorted_bounding_box_crop(image, bbox)
    distorted_image.set_shape([None, None, 3])
    distorted_image = tf.image.resize_images(
        distorted_image, [height, width], method=tf.image.ResizeMethod.BILINEAR)
    distorted_image = tf.image.random_flip_left_right(distorted_image)
    distorted_image = distort_color(distorted_image)
    distorted_image = tf.subtract(distorted_image, 0.5)
    return tf.multiply(distorted_image, 2.0)


def preprocess_for_eval(image, height, width, central_fraction=0.875,
                        scope=None):
  """The central crop of `image`, resized: [height, width, 3] in [-1, 1]."""
  with tf.name_scope(scope, 'eval_image', [image, height, width]):
    if image.dtype != tf.float32:
      image = tf.image.convert_image_dtype(image, dtype=tf.float32)
    if central_fraction:
      image = tf.image.central_crop(image, central_fraction=central_fraction)
    if height and width:
      image = tf.expand_dims(image, 0)
      image = tf.image.resize_bilinear(image, [height, width],
                                       align_corners=False)
      image = tf.squeeze(image, [0])
    image = tf.subtract(image, 0.5)
    return tf.multiply(image, 2.0)


def preprocess_image(image, height, width, is_training=False, bbox=None,
                     use_grayscale=False):
  """Preprocesses one image for training or evaluation."""
  if use_grayscale:
    image = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
  if is_training:
    return preprocess_for_train(image, height, width, bbox)
  return preprocess_for_eval(image, height, width)
