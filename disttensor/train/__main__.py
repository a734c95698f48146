"""``python -m disttensor.train ...``: the training command line (see :mod:`disttensor.train`)."""
import sys

from . import main

sys.exit(main())
