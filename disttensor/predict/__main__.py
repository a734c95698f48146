"""``python -m disttensor.predict ...``: the inference command line (see
:mod:`disttensor.predict`)."""
import sys

from . import main

sys.exit(main())
