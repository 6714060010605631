"""End-to-end demo of qat (work in progress: only the parts that exist run)."""
from absl import app

import qat


def main(argv):
    del argv
    print(f"qat {qat.__version__}: the end-to-end demo is not built yet "
          "(see issue 'TFLite export pipeline').")
    return 1


if __name__ == "__main__":
    app.run(main)
