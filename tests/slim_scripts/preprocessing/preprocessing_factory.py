"""Contains a factory for building various preprocessing (research/slim style)."""
from preprocessing import cifarnet_preprocessing
from preprocessing import inception_preprocessing
from preprocessing import lenet_preprocessing
from preprocessing import mobilenet_preprocessing
from preprocessing import vgg_preprocessing


def get_preprocessing(name, is_training=False, use_grayscale=False):
  """Returns preprocessing_fn(image, height, width, **kwargs).

  Args:
    name: The name of the preprocessing function.
    is_training: `True` if the model is being used for training and `False`
      otherwise.
    use_grayscale: Whether to convert the image from RGB to grayscale.

  Returns:
    preprocessing_fn: A function that preprocessing a single image (pre-batch).

  Raises:
    ValueError: If Preprocessing `name` is not recognized.
  """
  preprocessing_fn_map = {
      'cifarnet': cifarnet_preprocessing,
      'inception': inception_preprocessing,
      'inception_v1': inception_preprocessing,
      'inception_v2': inception_preprocessing,
      'inception_v3': inception_preprocessing,
      'lenet': lenet_preprocessing,
      # nets/mobilenet_v1_train.py's reduced preprocessing.
      'mobilenet_v1': mobilenet_preprocessing,
      'mobilenet_v1_025': inception_preprocessing,
      'mobilenet_v2': inception_preprocessing,
      'mobilenet_v2_035': inception_preprocessing,
      'mobilenet_v3_small': inception_preprocessing,
      'nasnet_cifar': inception_preprocessing,
      'nasnet_mobile': inception_preprocessing,
      'pnasnet_mobile': inception_preprocessing,
      'resnet_v1_50': vgg_preprocessing,
      'resnet_v2_50': vgg_preprocessing,
      'vgg': vgg_preprocessing,
      'vgg_a': vgg_preprocessing,
      'vgg_16': vgg_preprocessing,
  }

  if name not in preprocessing_fn_map:
    raise ValueError('Preprocessing name [%s] was not recognized' % name)

  def preprocessing_fn(image, output_height, output_width, **kwargs):
    return preprocessing_fn_map[name].preprocess_image(
        image, output_height, output_width, is_training=is_training,
        use_grayscale=use_grayscale, **kwargs)

  return preprocessing_fn
