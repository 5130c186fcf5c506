"""The value types of the command line's flags: each parses one flag's text, or refuses it
with the message argparse prints after the flag's name."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Generic, TypeVar

N = TypeVar("N", int, float)


class Number(Generic[N]):
    """A number that `parse` reads and every check accepts; the first check that fails words
    the refusal ("{value}" is the text given).

    Text that does not parse is refused with `unparsable` when given, else with the first
    check's refusal, which says what the flag accepts (never argparse's "invalid <type> value",
    which shows an internal name). A word of `off_words` (any case) is None.
    """

    def __init__(
        self,
        type_name: str,
        parse: Callable[[str], N],
        *checks: tuple[Callable[[N], bool], str],
        unparsable: str | None = None,
        off_words: tuple[str, ...] = (),
    ) -> None:
        self.__name__ = type_name  # what argparse calls the type
        self.parse: Callable[[str], N] = parse
        self.checks: tuple[tuple[Callable[[N], bool], str], ...] = checks
        self.unparsable = unparsable
        self.off_words = off_words

    def __call__(self, value: str) -> N | None:
        if value.lower() in self.off_words:
            return None
        try:
            n = self.parse(value)
        except ValueError:
            refusal = self.unparsable or self.checks[0][1]
            raise argparse.ArgumentTypeError(refusal.format(value=value)) from None
        for accepts, refusal in self.checks:
            if not accepts(n):
                raise argparse.ArgumentTypeError(refusal.format(value=value))
        return n


def _in_tcp_range(port: int) -> bool:
    return 0 < port < 65536


# integers
tcp_port = Number("_tcp_port", int, (_in_tcp_range, "{value} is not a TCP port (1-65535)"))
positive_int = Number("_positive_int", int, (lambda n: n >= 1, "{value} is not a positive integer"))
non_negative_int = Number("_count", int, (lambda n: n >= 0, "{value} is not an integer >= 0"))
verbose_level = Number("_log_verbose", int, (lambda n: n >= 0, "{value} is not a verbose level (0 or more)"))
#: a size or count for grpc core and the servers, which take an int32
int32_size = Number("_limit_int", int, (lambda n: 0 < n < 2**31, "{value} is not a positive integer up to 2147483647"))

# seconds
#: 0 or more; no upper bound (inf: never)
seconds = Number("_poll_secs", float, (lambda s: s >= 0, "{value} is not a number of seconds >= 0"))
#: 0 or more, finite
finite_seconds = Number(
    "_exit_timeout", float, (lambda s: 0 <= s < float("inf"), "{value} is not a number of seconds >= 0")
)
#: above 0 and below 1e9: a timer the servers arm
timer_seconds = Number("_positive_secs", float, (lambda s: 0 < s < 1e9, "{value} is not a number of seconds > 0"))

# seconds, as the state store's flags word them
_STORE_SECONDS = (lambda s: s >= 0 and s != float("inf"), "'{value}' must be a finite number of seconds >= 0")
_NOT_SECONDS = "'{value}' is not a number of seconds"
store_seconds = Number("_secs", float, _STORE_SECONDS, unparsable=_NOT_SECONDS)
store_positive_seconds = Number(
    "_positive_secs", float, _STORE_SECONDS, (lambda s: s > 0, "'{value}' must be > 0 seconds"), unparsable=_NOT_SECONDS
)


#: a front-end's port, or 'off' (None) to disable it
port_or_off = Number(
    "_port",
    int,
    (_in_tcp_range, "{value} is not a TCP port (1-65535) or 'off'"),
    off_words=("off", "none", "-1"),
)


#: Triton's milliseconds, as seconds: a timer the servers arm (above 0 and below 1e9 s)
milliseconds_as_seconds = Number(
    "milliseconds",
    lambda text: float(text) / 1000.0,
    (lambda s: 0 < s < 1e9, "{value} is not a number of milliseconds > 0"),
)
#: Triton's milliseconds, as seconds, 0 or more
milliseconds_or_zero_as_seconds = Number(
    "milliseconds",
    lambda text: float(text) / 1000.0,
    (lambda s: 0 <= s < 1e9, "{value} is not a number of milliseconds >= 0"),
)


#: the most front-end worker processes (each has its own rings and slab pools in the region)
MAX_WORKERS = 64
#: ``--workers auto``: one per CPU, up to this many
AUTO_WORKERS_CAP = 16


def worker_count(value: str) -> int:
    """``--workers``: a count from 1 to MAX_WORKERS, or 'auto' (one per CPU, up to AUTO_WORKERS_CAP)."""
    if value.strip().lower() == "auto":
        return max(
            1,
            min(
                len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                AUTO_WORKERS_CAP,
            ),
        )
    refusal = f"{value} is not a number of worker processes (1-{MAX_WORKERS}) or 'auto'"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(refusal) from None
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(refusal)
    return n


def boolean(value: str) -> bool:
    """Triton's boolean option values (true/false, 1/0, on/off, yes/no, any case)."""
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean (true or false)")


def state_store_url(value: str) -> str:
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in ("redis", "rediss", "unix", "dir"):
        raise argparse.ArgumentTypeError(f"'{value}' is not a state store: use redis://host:port/db or dir:///path")
    return value
