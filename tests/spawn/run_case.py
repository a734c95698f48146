"""Run one rank-mismatch case on every rank of this MPI job (see ``registry.py``).

    mpiexec -n 2 .venv/bin/python tests/spawn/run_case.py core.redistribute_split

Each rank prints (and writes to ``$DISTTENSOR_SPAWN_TMP/result-rank<r>.txt``) one line ``CASE <name> rank=<r> outcome=<raised|returned|error> type=<T>
secs=<s> msg=<first line>`` and exits 0 when the case did what it should on this rank (raised
the expected exception in time); the pytest side (``test_rank_mismatch.py``) checks the lines
of every rank.  ``--list`` prints the case names and their rank counts.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv):
    from tests.spawn.registry import Ctx, load_all
    cases = load_all()
    if argv[:1] == ["--list"]:
        for name, c in sorted(cases.items()):
            print(name, *c.nprocs, "even" if c.needs_even else "")
        return 0
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    c = cases[argv[0]]
    base = os.environ.get("DISTTENSOR_SPAWN_TMP") or tempfile.gettempdir()
    tmp = comm.bcast(tempfile.mkdtemp(prefix="case-", dir=base) if comm.rank == 0 else None)
    ctx = Ctx(comm, Path(tmp))
    t0 = time.perf_counter()
    outcome, typ, msg = "returned", "-", ""
    try:
        c.fn(ctx)
    except BaseException as e:  # noqa: BLE001 - reported below
        outcome, typ, msg = "raised", type(e).__name__, str(e)
        ok = isinstance(e, c.expect) and re.search(c.match, str(e)) is not None
        if not ok:
            outcome = "error"
            import traceback
            traceback.print_exc()
    secs = time.perf_counter() - t0
    first = msg.splitlines()[0] if msg else ""
    line = (f"CASE {c.name} rank={comm.rank} outcome={outcome} type={typ} secs={secs:.2f} "
            f"msg={first[:400]}")
    print(line, flush=True)
    # the launcher may interleave the ranks' output mid-line: the test reads these files
    with open(os.path.join(base, f"result-rank{comm.rank}.txt"), "w") as f:
        f.write(line + "\n")
    return 0 if outcome == "raised" and secs <= c.limit else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
