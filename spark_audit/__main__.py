"""``python -m spark_audit …`` and ``spark-submit spark_audit/__main__.py …``."""

import sys

from spark_audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
