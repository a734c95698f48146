"""One CSV of every benchmark figure, shared by all of bench/.

Each benchmark calls :func:`record` for each figure it prints (rank 0 only: pass
``rank=comm.rank`` or call it from rank 0).  Rows go to the file named by the environment
variable ``DISTTENSOR_BENCH_CSV`` (appended; the header is written when the file is new); with
the variable unset :func:`record` does nothing, so a benchmark run by hand prints as before.
``bench/run_all.py`` sets the variable, runs every benchmark and plots the CSV.

Columns:

``bench``     the script's short name (``conv``, ``halo``, ``perfmodel`` ...)
``case``      what was measured (a layer shape, a grid, a message size), free text
``metric``    the figure's name (``ratio_vs_sendrecv``, ``efficiency``, ``predicted_s`` ...)
``value``     the figure (float)
``unit``      ``s``, ``x`` (a same-run ratio), ``GB/s``, ``fraction`` ...
``target``    the issue's target for the figure, where there is one (empty otherwise)
``better``    ``higher`` or ``lower``: which side of ``target`` meets it
``ranks``     MPI ranks the figure was measured on
``device``    ``cpu`` or ``gpu``
"""
from __future__ import annotations

import csv
import os

__all__ = ["record", "FIELDS", "read"]

FIELDS = ("bench", "case", "metric", "value", "unit", "target", "better", "ranks", "device")


def record(bench: str, case: str, metric: str, value: float, unit: str = "", *,
           target: float | None = None, better: str = "higher", ranks: int = 1,
           device: str = "cpu", rank: int = 0) -> None:
    """Append one figure to ``$DISTTENSOR_BENCH_CSV`` (only where ``rank == 0``)."""
    path = os.environ.get("DISTTENSOR_BENCH_CSV")
    if not path or rank != 0:
        return
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        w.writerow([bench, case, metric, f"{float(value):.6g}", unit,
                    "" if target is None else f"{float(target):.6g}", better, int(ranks),
                    device])


def read(path: str) -> list[dict]:
    """The rows of a results CSV as dicts (``value``/``target`` as floats, ``target`` None
    where empty, ``ranks`` as int)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["value"] = float(r["value"])
        r["target"] = float(r["target"]) if r["target"] else None
        r["ranks"] = int(r["ranks"])
    return rows
