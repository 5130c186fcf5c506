"""Free loopback ports for servers a test starts: tests never bind a fixed port."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """`n` distinct ports the kernel reports free on 127.0.0.1 right now.

    The sockets stay open until all `n` are chosen, so the ports differ; another process may
    still take one before the server binds it, which `start_server` answers by retrying."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    """One free loopback port (see `free_ports`)."""
    (port,) = free_ports(1)
    return port
