"""What an HTTP/2 connection keeps beside its open streams: what its lower stream ids were (RFC
9113 5.1: a late frame on a stream this side reset is ignored, any other frame on a closed
stream is a STREAM_CLOSED stream error, HEADERS on an id never used a connection error), the
header block its frames are bringing, and the budgets that bound the frames a client may send
which cost work and carry nothing (the flood limits). ``H2Connection`` owns one of each."""

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
    SKIPPED_RANGES_KEPT,
    ProtocolError,
    RateWindow,
    unpad,
)


class ClosedStreams:
    """What a stream id below the highest opened one was: reset by this side (the last
    CLOSED_STREAMS_KEPT to twice that: frames the client had in flight are ignored), never used
    (the last SKIPPED_RANGES_KEPT ranges of ids a client skipped: HEADERS there is a connection
    error, RFC 9113 5.1.1), or else closed. Nothing is recorded for a stream that simply ends,
    so the common path costs nothing."""

    __slots__ = ("_reset_here", "_skipped")

    def __init__(self) -> None:
        self._reset_here: dict[int, None] = {}
        self._skipped: list[tuple[int, int]] = []

    def reset(self, stream_id: int) -> None:
        """This side sent RST_STREAM on the stream (or refused it)."""
        reset_here = self._reset_here
        reset_here[stream_id] = None
        if len(reset_here) > 2 * CLOSED_STREAMS_KEPT:  # the newest kept, in one pass now and then
            self._reset_here = dict.fromkeys(list(reset_here)[-CLOSED_STREAMS_KEPT:])

    def skipped(self, last_opened: int, stream_id: int) -> None:
        """A stream opened above the next id in line: the ids between were never used."""
        first = last_opened + 2 if last_opened else 1
        if stream_id > first:
            self._skipped.append((first, stream_id - 2))
            if len(self._skipped) > SKIPPED_RANGES_KEPT:
                del self._skipped[0]

    def reset_here(self, stream_id: int) -> bool:
        """Whether this side reset the stream (late frames on it are ignored)."""
        return stream_id in self._reset_here

    def never_used(self, stream_id: int) -> bool:
        return any(first <= stream_id <= last for first, last in self._skipped)


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

    __slots__ = ("_budgets", "pending")

    def __init__(self, budgets: FrameBudgets) -> None:
        self._budgets = budgets
        # (stream id, flags, block so far) of a block still incomplete: any frame but its
        # CONTINUATION is then a connection error
        self.pending: tuple[int, int, bytearray] | None = None

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
            self.pending = (sid, flags, bytearray(payload))
            return None
        return flags, payload

    def continuation(self, flags: int, sid: int, payload: bytes) -> tuple[int, bytes] | None:
        pending = self.pending
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
        self.pending = None
        return pending[1], bytes(block)
