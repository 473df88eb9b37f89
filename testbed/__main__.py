# PYTHON_ARGCOMPLETE_OK
"""``python -m testbed``: the ``testbed`` command (:func:`testbed.cli.main`)."""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main())
