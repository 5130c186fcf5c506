"""A framed, blocking message channel between the server and a child: a pipe each way for the
messages, and a Unix socket beside them for the rare message that carries descriptors.

Pipes, not the socket, carry the messages because they are the cheaper wake-up: a round trip
over a pair of pipes costs about 10 us here, one over a Unix socket about 16 us
(bench/results/isolation.txt). A message is a 4-byte little-endian length and the body; the
top bit of the length says that descriptors (``SCM_RIGHTS``) were sent on the socket just
before it. Each channel is used strictly request/reply, one message in flight per direction.

The server holds a second write end of each pipe it reads: its reaper (which waits for the
child's exit) marks the channel dead and writes to that end, so a thread blocked in ``recv``
wakes up even when the child's own end outlives it (a process the model forked). Errors:
``ChannelClosed`` when the peer is gone, ``TimeoutError`` when a ``recv`` timeout passes.
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
import struct
import threading

_LEN = struct.Struct("<I")
_HAS_FDS = 1 << 31
_MAX_FDS = 4
_CMSG_SPACE = socket.CMSG_SPACE(_MAX_FDS * 4)
#: the largest message (a peer that announces more is out of step)
MAX_MESSAGE = (1 << 30) - 1


class ChannelClosed(Exception):
    """The other process has closed its end (or exited)."""


class Channel:
    """One side of a channel: reads ``rfd``, writes ``wfd``, descriptors over ``fdsock``."""

    __slots__ = ("_buf", "_have", "_mv", "_poll", "dead", "fdsock", "rfd", "wfd")

    def __init__(self, rfd: int, wfd: int, fdsock: socket.socket) -> None:
        self.rfd = rfd
        self.wfd = wfd
        self.fdsock = fdsock
        self.dead = False  # set by the server's reaper before it wakes a blocked reader
        self._buf = bytearray(64 * 1024)
        self._mv = memoryview(self._buf)
        self._have = 0  # bytes of the next message already in _buf
        self._poll: select.poll | None = None

    def send(self, body: bytes | bytearray | memoryview, fds: list[int] | None = None) -> None:
        """Send one message (``body`` starts with its kind byte)."""
        n = len(body)
        if self.wfd < 0:
            raise ChannelClosed("closed")
        try:
            if fds:
                self.fdsock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                n |= _HAS_FDS
            data = _LEN.pack(n) + body
            done = os.write(self.wfd, data)
            while done < len(data):  # only for messages above the pipe's atomic size
                done += os.write(self.wfd, memoryview(data)[done:])
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
            raise ChannelClosed(str(e)) from None

    def recv(self, timeout: float | None = None) -> tuple[memoryview, list[int]]:
        """The next message's body (valid until the next ``recv``) and the descriptors that
        came with it. ``timeout`` (seconds) bounds the wait for the message to start."""
        if self.rfd < 0 or self.dead:
            raise ChannelClosed("closed")
        if timeout is not None and self._have == 0:
            if self._poll is None:
                self._poll = select.poll()
                self._poll.register(self.rfd, select.POLLIN)
            if not self._poll.poll(timeout * 1000):
                raise TimeoutError("no message within the timeout")
        while self._have < 4:
            self._fill(4)
        (word,) = _LEN.unpack_from(self._buf, 0)
        n = word & ~_HAS_FDS
        if n > MAX_MESSAGE:
            raise ChannelClosed(f"message of {n} bytes is out of step")
        end = 4 + n
        if end > len(self._buf):
            grown = bytearray(max(end, 2 * len(self._buf)))
            grown[: self._have] = self._mv[: self._have]
            self._buf = grown
            self._mv = memoryview(grown)
        while self._have < end:
            self._fill(end)
        fds = self._recv_fds() if word & _HAS_FDS else []
        body = self._mv[4:end]
        if self._have > end:  # never expected (request/reply), but keep what follows
            rest = bytes(self._mv[end : self._have])
            body = memoryview(bytes(body))
            self._mv[: len(rest)] = rest
            self._have = len(rest)
        else:
            self._have = 0
        return body, fds

    def _fill(self, want: int) -> None:
        n = os.readv(self.rfd, [self._mv[self._have :]])
        if n == 0:
            raise ChannelClosed("end of stream")
        self._have += n
        if self.dead and self._have < want:  # the peer died part way: what came is useless
            raise ChannelClosed("the peer has exited")

    def _recv_fds(self) -> list[int]:
        try:
            _data, anc, _flags, _addr = self.fdsock.recvmsg(1, _CMSG_SPACE)
        except OSError as e:
            raise ChannelClosed(str(e)) from None
        fds: list[int] = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[: len(data) - (len(data) % got.itemsize)])
                fds.extend(got)
        if not fds:
            raise ChannelClosed("descriptors announced but none arrived")
        return fds

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.rfd = self.wfd = -1
        self.fdsock.close()


class Ends:
    """The descriptors of one channel, made in the server: its own ``Channel``, the three
    descriptors the child gets, and the spare write end that wakes the server's reader."""

    def __init__(self) -> None:
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.wake_fd = os.dup(c2p_w)  # not inheritable (os.dup gives a non-inheritable copy)
        self._wake_lock = threading.Lock()  # the reaper wakes while the reader may be closing
        self.channel = Channel(c2p_r, p2c_w, mine)
        self.child_fds: tuple[int, ...] = (p2c_r, c2p_w, theirs.detach())

    def close_child_fds(self) -> None:
        """After the child has started with its copies."""
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()

    def wake(self) -> None:
        """Wake a thread blocked in the server's ``recv`` (it raises ChannelClosed); once."""
        self.channel.dead = True
        with self._wake_lock:
            if self.wake_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self.wake_fd, b"\0")
                os.close(self.wake_fd)
                self.wake_fd = -1

    def close(self) -> None:
        if self.child_fds:
            self.close_child_fds()
        with self._wake_lock:
            if self.wake_fd >= 0:
                os.close(self.wake_fd)
                self.wake_fd = -1
        self.channel.close()


def child_channel(p2c_r: int, c2p_w: int, sock_fd: int) -> Channel:
    """The child's side, from the three descriptors it was given."""
    for fd in (p2c_r, c2p_w, sock_fd):
        os.set_inheritable(fd, False)  # processes the model starts must not keep them
    return Channel(p2c_r, c2p_w, socket.socket(fileno=sock_fd))
