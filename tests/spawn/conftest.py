"""The spawned MPI jobs inherit this environment: convolution planning by the cost model
(deterministic, nothing timed or written to disk)."""
import os

os.environ.setdefault("DISTTENSOR_CONV_TUNE", "heuristic")
