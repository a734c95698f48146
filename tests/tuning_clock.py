"""A scripted tuning clock for tests of the online conv tuner (unit and MPI): injected
timings per candidate plan, instead of the wall or CPU clock."""
from __future__ import annotations

from disttensor.ops.local import microbatch as mb


def scripted_clock(cost):
    """A tuning clock (``cpu_entry.tuning_clock``'s stand-in) under which a timed call of
    candidate ``(name, b)`` (the plan the call runs, this thread's latest) takes
    ``cost((name, b))`` seconds."""
    state = {"t": 0.0, "start": True}

    def clock():
        if not state["start"]:
            state["t"] += cost(mb.last_plan().micro_batches[0])
        state["start"] = not state["start"]
        return state["t"]
    return lambda: clock
