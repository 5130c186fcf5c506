"""CPU accounting: a server's whole process tree (from /proc) and this client process.

Server CPU is the sum of user+sys time of the root process and every live descendant, as read
from ``/proc/<pid>/stat`` (utime, stime: all threads of a process are included there), plus the
root's and descendants' cutime/cstime, so the time of a child that exits and is reaped during
the window still counts (it moves from the child's utime to its parent's cutime). Resolution is
one clock tick (usually 10 ms), fine over windows of seconds.

Per process kind: the root's own user+sys time is the engine's (``seqserve serve --workers N``: the
parent process owns the models), everything else in the tree (live descendants, and the children
reaped during the window, through the root's cutime/cstime) is the children's: the worker
processes, or a model's isolation process.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    cpu_s: float  # user + sys seconds
    wall_s: float  # time.perf_counter() when taken
    nprocs: int = 1
    # the root process's threads, user+sys seconds by label: "main" (the thread whose tid is the pid,
    # e.g. the event loop) and the others by thread name (comm), summed over threads of that name
    threads: dict[str, float] | None = None
    # the root process's own user+sys seconds (its threads, not its children): see the module's doc
    root_cpu_s: float | None = None

    @property
    def children_cpu_s(self) -> float | None:
        """Everything in the tree but the root's own time."""
        return None if self.root_cpu_s is None else self.cpu_s - self.root_cpu_s


def root_threads(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        comm = data[data.index(b"(") + 1 : data.rindex(b")")].decode(errors="replace")
        fields = data[data.rindex(b")") + 2 :].split()
        label = "main" if int(tid) == pid else comm
        out[label] = out.get(label, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def _read_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, utime+stime+cutime+cstime, utime+stime in ticks) of one process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
    own = int(fields[11]) + int(fields[12])
    return int(fields[1]), own + int(fields[13]) + int(fields[14]), own


def process_tree(root: int) -> dict[int, int]:
    """{pid: cpu ticks} of ``root`` and all its live descendants (walks every /proc/<pid>)."""
    return {pid: total for pid, (total, _) in process_tree_detail(root).items()}


def process_tree_detail(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (cpu ticks with reaped children's, the process's own ticks)} of ``root`` and all its
    live descendants."""
    stats: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _read_stat(int(name))
            if st is not None:
                stats[int(name)] = st
    if root not in stats:
        raise ProcessLookupError(f"no process {root}")
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree: dict[int, tuple[int, int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        tree[pid] = stats[pid][1:]
        todo.extend(children.get(pid, ()))
    return tree


class ProcessTreeCpu:
    """Samples the CPU time of a process tree (a server and everything it started)."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        process_tree(root_pid)  # fail early when the pid does not exist

    def sample(self) -> CpuSample | None:
        """None when the server process is gone."""
        try:
            tree = process_tree_detail(self.root_pid)
        except ProcessLookupError:
            return None
        total = sum(t for t, _ in tree.values()) / CLK_TCK
        root_own = tree[self.root_pid][1] / CLK_TCK
        return CpuSample(total, time.perf_counter(), len(tree), root_threads(self.root_pid), root_own)


class ClientCpu:
    """This process (all its threads: the event loop, gRPC's poller threads); children excluded."""

    def sample(self) -> CpuSample:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return CpuSample(ru.ru_utime + ru.ru_stime, time.perf_counter())


class SystemCpu:
    """Busy CPU seconds of the whole machine (all CPUs, from /proc/stat): what is left after the server
    and the client is other load, which makes a run's numbers suspect on a shared machine."""

    def sample(self) -> CpuSample | None:
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()
        except OSError:
            return None
        # cpu user nice system idle iowait irq softirq steal (guest time is already in user)
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))
        return CpuSample(busy / CLK_TCK, time.perf_counter())


def split_delta(a: CpuSample | None, b: CpuSample | None) -> tuple[float | None, float | None]:
    """(root's own seconds, the children's seconds) between two samples of one tree; Nones when
    either sample is missing."""
    if a is None or b is None or a.root_cpu_s is None or b.root_cpu_s is None:
        return None, None
    return b.root_cpu_s - a.root_cpu_s, (b.children_cpu_s or 0.0) - (a.children_cpu_s or 0.0)


def find_listener_pid(port: int) -> int | None:
    """The pid of the process holding a listening TCP socket on ``port`` (any address), if we can see it.

    Matches the socket's inode from /proc/net/tcp{,6} against /proc/<pid>/fd links; processes of
    other users are invisible without privileges. Returns the lowest such pid (the parent, usually).
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                        inodes.add(f"socket:[{inode}]")
        except FileNotFoundError:
            continue
    if not inodes:
        return None
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except (PermissionError, FileNotFoundError):
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in inodes:
                    found.append(int(name))
                    break
            except OSError:
                continue
    return min(found) if found else None
