"""What an HTTP/2 connection keeps beside its open streams: how its recent streams closed (RFC
9113 5.1: a late frame on a stream this side reset is ignored, any other frame on a closed
stream is a STREAM_CLOSED stream error), the header block its frames are bringing, and the
budgets that bound the frames a client may send which cost work and carry nothing (the flood
limits). ``H2Connection`` owns one of each."""

from __future__ import annotations

from collections.abc import Callable

from seqserve.api.transport.h2_frames import (
    CLOSED_STREAMS_KEPT,
    CONTROL_WINDOW_S,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    MAX_CONTROL_FRAMES_PER_S,
    MAX_FLOW_FRAMES_PER_S,
    MAX_HEADER_BLOCK,
    MAX_RESETS_PER_S,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    RESET_WINDOW_S,
    ProtocolError,
    RateWindow,
    unpad,
)


class ClosedStreams:
    """The ids of the last CLOSED_STREAMS_KEPT streams that closed, and whether this side reset
    them (RST_STREAM sent: frames the client had in flight are ignored)."""

    __slots__ = ("_closed",)

    def __init__(self) -> None:
        self._closed: dict[int, bool] = {}

    def add(self, stream_id: int, reset_here: bool) -> None:
        closed = self._closed
        closed[stream_id] = reset_here
        if len(closed) > CLOSED_STREAMS_KEPT:
            del closed[next(iter(closed))]

    def reset_here(self, stream_id: int) -> bool:
        """Whether this side reset the stream (late frames on it are ignored)."""
        return self._closed.get(stream_id, False)

    def known(self, stream_id: int) -> bool:
        """Whether the stream was opened and is remembered closed (a lower id that is not was
        never used, or closed long ago)."""
        return stream_id in self._closed


class FrameBudgets:
    """The rates a client's frames are held to (``h2_frames``): ``control`` and ``flow`` raise
    a connection error ENHANCE_YOUR_CALM past theirs; ``reset`` says whether streams reset
    (by the client, or by this side for what the client did) came too fast."""

    __slots__ = ("_clock", "_controls", "_flow", "_resets")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._controls = RateWindow(MAX_CONTROL_FRAMES_PER_S, CONTROL_WINDOW_S)
        self._flow = RateWindow(MAX_FLOW_FRAMES_PER_S, CONTROL_WINDOW_S)
        self._resets = RateWindow(MAX_RESETS_PER_S, RESET_WINDOW_S)

    def control(self, n: int = 1) -> None:
        if self._controls.add(self._clock(), n):
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many control frames")

    def flow(self) -> None:
        if self._flow.add(self._clock()):
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many PING or WINDOW_UPDATE frames")

    def reset(self) -> bool:
        return self._resets.add(self._clock())


class HeaderFrames:
    """A header block as it arrives: a HEADERS frame, then CONTINUATION frames on the same
    stream until END_HEADERS (RFC 9113 6.2, 6.10), the whole held to MAX_HEADER_BLOCK. Each
    method returns (the HEADERS' flags, the block) once the block is complete."""

    __slots__ = ("_budgets", "_pending")

    def __init__(self, budgets: FrameBudgets) -> None:
        self._budgets = budgets
        self._pending: tuple[int, int, bytearray] | None = None  # stream id, flags, block so far

    @property
    def pending(self) -> bool:
        """A block is incomplete: any frame but its CONTINUATION is a connection error."""
        return self._pending is not None

    def headers(self, flags: int, sid: int, payload: bytes) -> tuple[int, bytes] | None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if len(payload) > MAX_HEADER_BLOCK:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if not flags & END_HEADERS:
            self._pending = (sid, flags, bytearray(payload))
            return None
        return flags, payload

    def continuation(self, flags: int, sid: int, payload: bytes) -> tuple[int, bytes] | None:
        pending = self._pending
        if pending is None or pending[0] != sid:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = pending[2]
        if not payload:
            self._budgets.control()  # an empty CONTINUATION carries nothing
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if not flags & END_HEADERS:
            return None
        self._pending = None
        return pending[1], bytes(block)
