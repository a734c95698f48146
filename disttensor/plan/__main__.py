"""``python -m disttensor.plan ...``: rank grids on a machine (see :mod:`disttensor.plan`)."""
import sys

from . import main

sys.exit(main())
