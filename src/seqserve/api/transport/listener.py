"""Closing a listening socket without resetting the connections queued on it.

Closing a listener resets every connection the kernel has completed but the server has not yet
accepted, and a client may have sent its request on one already. So a server that stops first
makes the kernel drop new handshakes (a socket filter that drops each SYN: the client's connect
goes unanswered, and after the close its retry is refused, before any request is sent; the
handshakes under way complete), then accepts what is queued (and answers it), and only then
closes. Linux only; elsewhere the listener simply closes.
"""

from __future__ import annotations

import asyncio
import ctypes
import socket
import struct
from typing import Any

#: setsockopt option of Linux's classic BPF socket filters
SO_ATTACH_FILTER = 26
#: classic BPF over the TCP header (what a TCP socket's filter sees): drop a packet whose flags
#: are SYN without ACK (a new handshake), keep every other (handshakes under way, data)
_DROP_NEW_HANDSHAKES = b"".join(
    struct.pack("=HBBI", code, jt, jf, k)
    for code, jt, jf, k in (
        (0x30, 0, 0, 13),  # ldb [13]: the flags byte
        (0x54, 0, 0, 0x12),  # and #(SYN | ACK)
        (0x15, 0, 1, 0x02),  # jeq #SYN: next, else skip one
        (0x06, 0, 0, 0),  # ret #0: drop
        (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: keep
    )
)
#: struct tcp_info: the offset of tcpi_unacked, which a listener fills with its accept queue's length
_TCPI_UNACKED = 24


def refuse_new_handshakes(sock: Any) -> bool:
    """Make the kernel drop new connections to listening ``sock`` (those already queued or under
    way stay to be accepted). True when it could (Linux); else nothing changes."""
    program = ctypes.create_string_buffer(_DROP_NEW_HANDSHAKES, len(_DROP_NEW_HANDSHAKES))
    fprog = struct.pack("@HP", len(_DROP_NEW_HANDSHAKES) // 8, ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except (OSError, AttributeError, TypeError):
        return False
    return True


def accept_queue_length(sock: Any) -> int | None:
    """How many connections wait in listening ``sock``'s accept queue (Linux); None if unknown."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError, TypeError):
        return None
    if len(info) < _TCPI_UNACKED + 4:
        return None
    return int(struct.unpack_from("=I", info, _TCPI_UNACKED)[0])


async def accept_queued(listener: asyncio.Server, within_s: float = 1.0) -> None:
    """Drop new handshakes on ``listener``'s sockets, then give the loop until their accept
    queues are empty (at most ``within_s``) to accept what is queued, so that closing the
    listener resets no connection."""
    sockets = [s for s in listener.sockets if refuse_new_handshakes(s)]
    if not sockets:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    await asyncio.sleep(0.01)  # handshakes under way complete
    while loop.time() < deadline and any(accept_queue_length(s) for s in sockets):
        await asyncio.sleep(0.005)
