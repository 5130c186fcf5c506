"""One child process of an isolated instance: its pipes, its exit status, the restart backoff."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

from seqserve.engine.isolation import results
from seqserve.engine.isolation.channel import Ends

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0
#: how long a child that closed its channel may take to exit before it is killed
EXIT_WAIT_S = 5.0


def exit_status(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode}, {name}"
    return f"exit code {returncode}"


def backoff_delay(streak: int) -> float:
    """Delay before restart number ``streak`` of a run of quick deaths: the first is immediate."""
    if streak <= 1:
        return 0.0
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (streak - 2)))


class ChildProcess:
    """One child process and the server's ends of its channels."""

    def __init__(self, proc: subprocess.Popen[bytes], ends: tuple[Ends, Ends], life_w: int, names: tuple[str, ...]):
        self.proc = proc
        self.pid = proc.pid
        self._ends = ends
        self.batch = ends[0].channel
        self.events = ends[1].channel
        self.life_w = life_w
        self.started = time.monotonic()
        self.uses_responders = False
        self.results = results.ResultReader(names)
        self.event_reader = results.EventReader(names)
        self.adopted = False  # READY and serving (not a child that failed to start)
        self.retiring = False  # stopped on purpose: finalize, or a failed start
        self.killed_for = ""  # why the server killed it (an execute timeout)
        self.death = ""  # the message its exit gave its batch and the log
        self.reaped = False  # its exit is known (set under the instance's lock)
        self.exited = threading.Event()  # set once the reaper has recorded the exit

    def wait_exit(self) -> None:
        """After its channel closed: wait for the reaper to record the exit (kill it if it
        lingers with its end closed)."""
        if not self.exited.wait(EXIT_WAIT_S):
            self.kill()
            self.exited.wait()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()

    def exited_now(self) -> None:
        """Reaper, once the process has exited: wake any thread blocked on its channels (they
        see end of stream) and let go of the pipe that told the child the server was alive.
        The channels themselves are closed by the threads that use them, never under them."""
        for ends in self._ends:
            ends.wake()
        if self.life_w >= 0:
            os.close(self.life_w)
            self.life_w = -1

    def close_batch(self) -> None:
        """By the thread that drives the batch channel, once it is done with this child."""
        self._ends[0].close()
        self.results.close()

    def close_events(self) -> None:
        """By the event thread, as it ends."""
        self._ends[1].close()
        self.event_reader.close()
