"""The qat package imports and exposes its public API."""
from absl.testing import absltest

import qat


class PackageTest(absltest.TestCase):

    def test_version_is_semver(self):
        parts = qat.__version__.split(".")
        self.assertLen(parts, 3)
        for part in parts:
            self.assertTrue(part.isdigit(), qat.__version__)

    def test_public_names_exist(self):
        for name in qat.__all__:
            self.assertTrue(hasattr(qat, name), name)

    def test_graph_editor_is_a_module(self):
        from qat import graph_editor as ge
        self.assertIs(ge, qat.graph_editor)


if __name__ == "__main__":
    absltest.main()
