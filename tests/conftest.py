"""pytest set-up: the same environment Bazel's .bazelrc gives each py_test."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# absltest.main creates its temp directory; under pytest nothing does, and
# tests calling absltest.get_default_test_tmpdir() directly need it.
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

os.makedirs(absltest.get_default_test_tmpdir(), exist_ok=True)
