"""Hypothesis profile of the pure tests: derandomized by default, so a run (CI's included) is
reproducible and a failure seen once is seen again; ``DISTTENSOR_HYPOTHESIS_RANDOM=1`` draws
fresh examples (worth doing now and then: that is how new edge cases are found)."""
import os

from hypothesis import settings

# convolution planning: the cost model (deterministic, nothing timed or written to disk);
# tests/unit/test_microbatch.py exercises the benchmark mode explicitly
os.environ.setdefault("DISTTENSOR_CONV_TUNE", "heuristic")

settings.register_profile("disttensor-unit", derandomize=True, deadline=None, database=None)
settings.register_profile("disttensor-unit-random", deadline=None)
settings.load_profile("disttensor-unit-random" if os.environ.get("DISTTENSOR_HYPOTHESIS_RANDOM")
                      == "1" else "disttensor-unit")
