"""The UCI digits (bundled with scikit-learn), split the way the training tests use them."""
import numpy as np


def digits_split():
    """Returns ((train images, labels), (test images, labels)).

    Images are NHWC float32 in [0, 1], labels int32; a fixed shuffle (seed 0),
    1,400 training and 397 test images.
    """
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    return (images[:1400], labels[:1400]), (images[1400:], labels[1400:])
