"""``--profile``: the step profiler (:func:`disttensor.profile`) over steady-state steps of a
training run.

After ``--profile-warmup`` training steps (default 2: the first steps compile kernels, tune
convolutions and set up exchanges), the next ``--profile-steps`` steps (default 5) are
profiled with wall and CPU time; then ``OUT/profile/`` receives ``trace-rank{r}.json`` per
rank and ``trace.json`` (every rank, Chrome's Trace Event format: open them in Perfetto or
``chrome://tracing``) and ``summary.txt`` (the wall-clock and the CPU-time tables), and the
wall-clock table is printed.  A run that stops first writes the steps it profiled.  The data
loading before each step and the loop's bookkeeping after it are the ``(outside ops)`` row.
Collective over the run's communicator.
"""
from __future__ import annotations

import os

from ..core.comm import collective
from ..core.profiler import profile

__all__ = ["StepProfiler", "PROFILE_DIR"]

PROFILE_DIR = "profile"


class StepProfiler:
    """Profiles steps ``warmup + 1 .. warmup + steps`` of the run (none when ``args.profile``
    is off); :meth:`before_step` / :meth:`after_step` bracket every training step,
    :meth:`finish` writes the results (once; also called when the run ends)."""

    def __init__(self, args, comm, progress):
        self.on = bool(getattr(args, "profile", False))
        self.warmup, self.steps = args.profile_warmup, args.profile_steps
        self.comm, self.progress = comm, progress
        self.out = os.path.join(args.out, PROFILE_DIR)
        self.prof = None
        self.seen = self.done = 0

    def before_step(self) -> None:
        if not self.on or self.done >= self.steps:
            return
        if self.prof is None and self.seen == self.warmup:
            self.prof = profile(comm=self.comm, cpu_time=True).__enter__()
        elif self.prof is not None:
            self.prof.step_boundary()  # the batch was read since the last mark: no op's

    def after_step(self) -> None:
        if not self.on:
            return
        self.seen += 1
        if self.prof is not None and self.done < self.steps:
            self.prof.step()
            self.done += 1
            if self.done == self.steps:
                self.finish()

    def finish(self) -> None:
        """Stop profiling and write ``OUT/profile/`` (collective; nothing when no step was
        profiled or the results are written already)."""
        prof, self.prof = self.prof, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        self.done = self.steps
        if not prof.step_marks:
            return
        wall, cpu = prof.summary(), prof.summary(clock="cpu")
        prof.write_chrome_trace(self.out)
        with collective(self.comm):
            if self.comm.rank == 0:
                with open(os.path.join(self.out, "summary.txt"), "w") as f:
                    f.write(wall + "\n\n" + cpu + "\n")
        self.progress.say(f"{wall}\nprofile of {len(prof.step_marks)} steps: "
                          f"{self.out}/summary.txt, {self.out}/trace-rank*.json, "
                          f"{self.out}/trace.json")

    def abandon(self) -> None:
        """Stop profiling without writing (the run failed, or finished: a no-op then)."""
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
