"""Micro-batched convolution under a workspace limit; see :mod:`.planner`."""
from .planner import *  # noqa: F401,F403
from .planner import (UNDIVIDED_MARGIN, Im2colBatched, Im2colTiled, __all__,  # noqa: F401
                      _limit_overrides, _state, _warned, get_plan, undivided_margin)
