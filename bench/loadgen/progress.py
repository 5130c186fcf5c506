"""The generator's progress display: one stderr line redrawn with \\r, and the per-run lines."""

from __future__ import annotations

import shutil
import sys


class ProgressBar:
    """One stderr line redrawn with \\r: a bar over the whole plan and the current run's state.
    Off when stderr is not a terminal or with --quiet; per-run result lines are printed either way
    (unless --quiet)."""

    def __init__(self, quiet: bool, total_runs: int) -> None:
        self.quiet = quiet
        self.bar = not quiet and sys.stderr.isatty()
        self.total = max(1, total_runs)
        self.done_runs = 0
        self.prefix = ""
        self.drawn = False

    def update(self, frac: float, text: str) -> None:
        if not self.bar:
            return
        overall = min(1.0, (self.done_runs + max(0.0, min(1.0, frac))) / self.total)
        width = 24
        fill = int(overall * width)
        line = f"[{'#' * fill}{'.' * (width - fill)}] {overall:4.0%} {self.prefix} {text}"
        cols = shutil.get_terminal_size((100, 20)).columns
        sys.stderr.write("\r\x1b[K" + line[: cols - 1])
        sys.stderr.flush()
        self.drawn = True

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            self.drawn = False
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def run_done(self) -> None:
        self.done_runs += 1

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False
