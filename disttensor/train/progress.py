"""Rank 0's progress output during training.

On a terminal (and with ``tqdm`` importable) each epoch gets a ``tqdm`` bar over its steps with
the loss and samples/s; the epoch's result line replaces it when the epoch ends.  When stdout
is not a terminal (a log file, a pipe, a batch job) nothing is written per step and the final
lines (one per epoch, the stop line) are printed as plain lines: the format log readers and
tests rely on.  Other ranks, and ``--quiet``, write nothing.  Nothing here communicates.
"""
from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """The progress output of rank 0 (``enabled``): a tqdm bar per epoch on a terminal, the
    final lines only otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = enabled and sys.stdout.isatty()
        self._bar = None
        self._tqdm = None
        if self.tty:
            try:
                from tqdm import tqdm
                self._tqdm = tqdm
            except ImportError:  # the hand-written line below
                pass

    def step(self, text: str, desc: str, done: int, total: int, loss: float, rate: float):
        """After step ``done`` (1-based) of ``total`` in the epoch ``desc``: the bar on a
        terminal (``text``, the plain progress line, without tqdm)."""
        if not self.enabled:
            return
        if self._tqdm is None:
            self.update(text)
            return
        if self._bar is None or self._bar.desc != desc:
            self._close()
            self._bar = self._tqdm(total=total, initial=done - 1, desc=desc, unit="step",
                                   file=sys.stdout, dynamic_ncols=True, leave=False)
        self._bar.update(done - self._bar.n)
        self._bar.set_postfix(loss=f"{loss:.5f}", samples_s=f"{rate:.1f}", refresh=True)

    def _close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def update(self, text: str, final: bool = False):
        """``text`` as the progress line (rewritten in place on a terminal); ``final``: a
        line that stays (printed also when not on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            if final:
                self._close()
                print(text, flush=True)
            return
        if self.tty:
            sys.stdout.write("\r" + text.ljust(100) + ("\n" if final else ""))
            sys.stdout.flush()
        elif final:
            print(text, flush=True)

    def say(self, text: str):
        """A line that stays (above the bar, if one is shown)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self):
        """Remove a bar left open (a run that stopped part-way)."""
        self._close()
