"""pytest set-up: the same environment Bazel's .bazelrc gives each py_test."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
