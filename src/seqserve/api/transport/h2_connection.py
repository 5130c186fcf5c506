"""The server side of an HTTP/2 connection (RFC 9113) as a state machine without I/O: bytes in
(``receive_data``, which yields ``h2_events``), commands (``accept``, ``send_headers``,
``send_data``, ``send_reply``, ``reset``, ``consumed``, ``ping``, ``send_goaway``, ``close``)
and bytes out (``data_to_send``). The asyncio adapter (``h2_protocol``) owns the socket and the
timers; the gRPC call layer (``grpc_calls``) handles the events. Tests: test_h2_connection.py and
tests/conformance/h2.

What a gRPC server needs and nothing else: no server push, no priorities (parsed and ignored),
reply header blocks that never insert into the dynamic table (every block leaves through
``Outbound.header_frames``, which prefixes the table size update a client that lowers its
table is owed), HPACK decoding by ``hpack`` (``h2_hpack``). Every size is checked before it is
kept:

- a frame over ``MAX_FRAME_SIZE`` (advertised) is a FRAME_SIZE_ERROR;
- a header block over ``MAX_HEADER_BLOCK`` (HEADERS plus CONTINUATION, compressed) ends the
  connection; a decoded one over ``max_header_list_bytes`` (advertised) fails its stream alone
  (``RequestReceived.header_list_size``, checked above); a malformed request (``h2_fields``)
  is a stream error PROTOCOL_ERROR;
- a stream or the connection sending more than its window is a FLOW_CONTROL_ERROR; windows are
  given back as the layer above consumes what it was sent (``consumed``);
- streams beyond ``max_concurrent_streams`` are refused (REFUSED_STREAM), and a client that
  resets streams faster than ``MAX_RESETS_PER_S`` gets a GOAWAY (the "rapid reset" attack);
- every frame that costs work and carries nothing is budgeted (``h2_streams.FrameBudgets``),
  frames on closed streams included;
- at most ``FRAMES_PER_TURN`` frames (decoded header fields weigh 1/FIELDS_PER_FRAME each)
  are handled per ``receive_data``: the rest waits for the adapter's next turn (``backlog``),
  so one read of tiny frames cannot hold the event loop.

Events that commands cause (a stream reset, an outbox emptied): ``take_events``, by the caller.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import hpack.exceptions

from seqserve.api.transport.h2_events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    RequestReceived,
    SettingsChanged,
    StreamEnded,
    StreamReset,
    StreamWritable,
)
from seqserve.api.transport.h2_fields import trailers_error
from seqserve.api.transport.h2_frames import (
    ACK,
    COMPRESSION_ERROR,
    CONNECTION_WINDOW,
    CONTINUATION,
    DATA,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    FRAMES_PER_TURN,
    GOAWAY,
    GOAWAY_HEAD,
    HEADERS,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    STREAM_WINDOW,
    U32,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
    server_preface,
    settings_entries,
    unpad,
)
from seqserve.api.transport.h2_hpack import HeaderDecoder
from seqserve.api.transport.h2_outbound import Outbound, StreamState
from seqserve.api.transport.h2_streams import ClosedStreams, FrameBudgets, HeaderFrames

log = logging.getLogger("seqserve.grpc")


class H2Connection:
    """A server-side HTTP/2 connection. ``on_output`` is called when bytes wait to be sent
    (the first since the last ``data_to_send``) and when the connection closes; ``clock``
    times the rate limits and the streams' progress."""

    def __init__(
        self,
        *,
        max_concurrent_streams: int,
        max_header_list_bytes: int,
        on_output: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.max_header_list_bytes = max_header_list_bytes
        self._on_output = on_output
        self._clock = clock
        self.streams: dict[int, StreamState] = {}
        self.last_stream_id = 0  # the highest stream id the client opened
        self.recv_window = CONNECTION_WINDOW
        self.recv_unacked = 0
        self.decoder = HeaderDecoder()
        self.good_fields: set[tuple[bytes, bytes]] = set()  # request fields found well-formed
        self.closed = False  # a GOAWAY that ends it was queued, or the transport is gone
        self.goaway_sent = False
        self.peer_goaway = False
        self.settings_seen = False
        self.backlog = False  # frames wait for the next receive turn (FRAMES_PER_TURN)
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._pending: collections.deque[Event] = collections.deque()
        self.outbound = Outbound(self._write, self._drained, self._local_end, clock)
        # the send commands are the outbound half's own (no call in between on the hot path):
        # a header block or trailers behind the stream's DATA; DATA within the windows, the
        # rest queued (whether all of it went out); a whole reply, in one write when it fits
        self.send_headers = self.outbound.headers
        self.send_data = self.outbound.data
        self.send_reply = self.outbound.reply
        self._preface = False
        # streams reset by the client, or by us for what the client did, each free a stream
        # slot while its handler's work may go on (the "rapid reset" attack); frames that carry
        # nothing cost work too: both are budgeted
        self.budgets = FrameBudgets(clock)
        self.closed_streams = ClosedStreams()
        self.header_frames = HeaderFrames(self.budgets)
        self._content_length = -1  # of the request whose RequestReceived is being handled
        self.last_active = clock()
        self.idle_since: float | None = self.last_active  # None while a stream is open

    # ------------------------------------------------------------------------ output

    def initiate(self) -> None:
        """The server's preface: its SETTINGS, and the connection window raised."""
        self._write(server_preface(self.max_concurrent_streams, self.max_header_list_bytes))

    def data_to_send(self) -> bytes:
        """What to send, joined once: the writes of one adapter turn cost one system call."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def _write(self, data: bytes) -> None:
        if self.closed:
            return
        out = self._out
        out.append(data)
        if len(out) == 1:
            self._on_output()

    def take_events(self) -> Sequence[Event]:
        """The events that commands caused (streams reset or drained), oldest first."""
        if not self._pending:
            return ()
        events = list(self._pending)
        self._pending.clear()
        return events

    def close(self, code: int = NO_ERROR, message: str = "") -> None:
        """GOAWAY with ``code``; nothing more is accepted or sent after it."""
        if self.closed:
            return
        self.send_goaway(code, message)
        self.closed = True
        self._pending.append(ConnectionTerminated(code, message))
        self._on_output()

    def send_goaway(self, code: int = NO_ERROR, message: str = "") -> None:
        if not self.closed:
            self.goaway_sent = True
            debug = message.encode()[:256]
            self._write(frame(GOAWAY, 0, 0, GOAWAY_HEAD.pack(self.last_stream_id, code) + debug))

    def ping(self, payload: bytes) -> None:
        self._write(frame(PING, 0, 0, payload))

    def connection_lost(self) -> None:
        """The transport is gone: every stream ends (StreamReset, StreamWritable)."""
        self.closed = True
        self._out.clear()
        streams, self.streams = self.streams, {}
        self.outbound.clear()
        for s in streams.values():
            s.remote_open = s.local_open = False
            self._pending.append(StreamReset(s))
            self._pending.append(StreamWritable(s))

    # ------------------------------------------------------------------------- input

    def feed(self, data: bytes) -> None:
        """Buffer received bytes without handling them (the adapter's turn is over)."""
        self._buf += data
        self.last_active = self._clock()

    def receive_data(self, data: bytes) -> Iterator[Event]:
        """Buffer ``data`` and handle its frames (``events``): each frame's events come before
        the next frame is handled, so the caller's commands act on the state they saw."""
        self.feed(data)
        return self.events()

    def events(self) -> Iterator[Event]:
        """Handle the frames buffered (at most FRAMES_PER_TURN), yielding their events."""
        self.backlog = False
        if self.closed:  # after its GOAWAY a connection reads nothing
            return
        buf = self._buf
        pos = 0
        pending = self._pending
        failure: tuple[int, str] | None = None
        try:
            if not self._preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if bytes(buf[: len(PREFACE)]) != PREFACE:
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface = True
                pos = len(PREFACE)
            n = len(buf)
            frames = 0
            while n - pos >= 9 and not self.closed:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > MAX_FRAME_SIZE:
                    raise ProtocolError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {MAX_FRAME_SIZE}")
                end = pos + 9 + length
                if end > n:
                    break
                if frames >= FRAMES_PER_TURN:  # the rest in the next turn
                    self.backlog = True
                    break
                frames += 1
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[pos + 9 : end])
                pos = end
                if self.header_frames.pending is not None and kind != CONTINUATION:
                    raise ProtocolError(PROTOCOL_ERROR, "header block interrupted")
                if not self.settings_seen and kind != SETTINGS:
                    raise ProtocolError(PROTOCOL_ERROR, "the first frame must be SETTINGS")
                if kind == DATA:
                    delivery = self._data(flags, sid, payload)
                    if delivery is not None:
                        stream, data = delivery
                        if data:
                            yield DataReceived(stream, data, length)
                        elif not flags & END_STREAM:
                            self.budgets.control()  # an empty DATA frame carries nothing
                        if flags & END_STREAM and sid in self.streams:
                            if stream.content_left > 0:
                                self.reset(stream, PROTOCOL_ERROR)  # less DATA than its content-length
                            else:
                                stream.remote_open = False
                                yield StreamEnded(stream)
                                if not stream.local_open:
                                    self._discard(stream)
                elif kind == HEADERS:
                    block = self.header_frames.headers(flags, sid, payload)
                    if block is not None:
                        yield from self._header_block(sid, *block)
                        if self.decoder.fields_decoded:  # not a cached block
                            frames += self.decoder.cost_in_frames()
                elif kind == CONTINUATION:
                    block = self.header_frames.continuation(flags, sid, payload)
                    if block is not None:
                        yield from self._header_block(sid, *block)
                        if self.decoder.fields_decoded:  # not a cached block
                            frames += self.decoder.cost_in_frames()
                else:
                    self._control_frame(kind, flags, sid, payload)
                while pending:
                    yield pending.popleft()
        except ProtocolError as e:
            log.debug("gRPC connection error %d: %s", e.code, e)
            failure = (e.code, str(e))
        except hpack.exceptions.HPACKError as e:
            log.debug("gRPC connection HPACK error: %s", e)
            failure = (COMPRESSION_ERROR, "header block not decodable")
        finally:
            del buf[:pos]
        if failure is not None:
            self.close(*failure)
            while pending:
                yield pending.popleft()

    def _control_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == PING:
            if sid:
                raise ProtocolError(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
            self.budgets.flow()
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
            else:
                self._pending.append(PingAcknowledged(payload))
        elif kind == SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == RST_STREAM:
            self._rst_stream(sid, payload)
        elif kind == PRIORITY:
            if not sid:
                raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "PRIORITY of other than 5 bytes")
            self.budgets.control()
        elif kind == GOAWAY:
            if sid:
                raise ProtocolError(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self.budgets.control()
            self.peer_goaway = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:
            self.budgets.control()  # unknown frame types are ignored (RFC 9113 4.1), not free

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if not self.settings_seen:
                raise ProtocolError(PROTOCOL_ERROR, "the first frame must be SETTINGS, not its ACK")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        self.budgets.control(1 + len(payload) // (6 * 32))  # counted before its entries are read
        changes = settings_entries(payload)
        self.settings_seen = True
        outbound = self.outbound
        if S_MAX_FRAME_SIZE in changes:
            outbound.max_frame = changes[S_MAX_FRAME_SIZE]
        if S_HEADER_TABLE_SIZE in changes:
            outbound.decoder_table_size(changes[S_HEADER_TABLE_SIZE])
        window = changes.get(S_INITIAL_WINDOW_SIZE)
        if window is not None and window != outbound.initial_window:
            self.budgets.control(1 + len(self.streams) // 64)
            outbound.change_initial_window(window, list(self.streams.values()))
        self._write(frame(SETTINGS, ACK, 0))
        if changes:
            self._pending.append(SettingsChanged(changes))

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if increment == 0:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.budgets.flow()
            self.outbound.window += increment
            if self.outbound.window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self.outbound.flush_blocked()
            return
        s = self.streams.get(sid)
        if s is None:
            if sid > self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            self.budgets.control()  # a stream closed since: ignored (RFC 9113 5.1), not free
            return
        if increment == 0:
            self.reset(s, PROTOCOL_ERROR)
            return
        self.budgets.flow()
        s.send_window += increment
        if s.send_window > MAX_WINDOW:
            self.reset(s, FLOW_CONTROL_ERROR)
            return
        if s.outbox is not None:
            self.outbound.flush(s)

    def _rst_stream(self, sid: int, payload: bytes) -> None:
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
        if sid > self.last_stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        s = self.streams.pop(sid, None)
        if s is None:
            self.budgets.control()  # a stream closed since: ignored, not free
            return
        s.remote_open = s.local_open = False
        self.outbound.forget(sid)
        self._pending.append(StreamReset(s))
        self._pending.append(StreamWritable(s))
        if self.budgets.reset():
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many streams reset")
        self._after_close()

    def _data(self, flags: int, sid: int, payload: bytes) -> tuple[StreamState, bytes] | None:
        """Account a DATA frame; its stream and payload (unpadded) when they are delivered."""
        if not sid:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        # the connection's window is given back as DATA arrives: each stream's own window and
        # the layer above's message limit bound what is held
        self.recv_window -= size
        if self.recv_window < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "more DATA than the connection window")
        self.recv_unacked += size
        if self.recv_unacked >= CONNECTION_WINDOW // 4:
            self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        if flags & PADDED:
            payload = unpad(payload)
        s = self.streams.get(sid)
        if s is None or not s.remote_open:
            if sid > self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            if s is not None:  # half-closed (remote): a stream error (RFC 9113 5.1)
                self.reset(s, STREAM_CLOSED)
            else:
                self._closed_stream_frame(sid)
            return None
        s.progress = self._clock()
        s.recv_window -= size
        if s.recv_window < 0:
            self.reset(s, FLOW_CONTROL_ERROR)
            return None
        if s.content_left >= 0:
            s.content_left -= len(payload)
            if s.content_left < 0:  # more DATA than its content-length: malformed (8.1.1)
                self.reset(s, PROTOCOL_ERROR)
                return None
        if size > len(payload):
            self.consumed(s, size - len(payload))  # padding: counted against the window, consumed now
        return s, payload

    def _closed_stream_frame(self, sid: int) -> None:
        """DATA or HEADERS on a closed stream: ignored when this side reset it (the client may
        have sent it before it knew), else a stream error STREAM_CLOSED; budgeted either way."""
        self.budgets.control()
        if not self.closed_streams.reset_here(sid):
            self._write(frame(RST_STREAM, 0, sid, U32.pack(STREAM_CLOSED)))

    def _header_block(self, sid: int, flags: int, block: bytes) -> Iterator[Event]:
        decoded = self.decoder.decode(block)  # always: the HPACK table must stay in step
        end_stream = bool(flags & END_STREAM)
        s = self.streams.get(sid)
        if s is not None:  # trailers: gRPC clients send none, but they must end the stream
            if decoded.skipped:
                self.reset(s, ENHANCE_YOUR_CALM)
            elif not s.remote_open:  # half-closed (remote): RFC 9113 5.1
                self.reset(s, STREAM_CLOSED)
            elif not end_stream or trailers_error(decoded.headers) or s.content_left > 0:
                self.reset(s, PROTOCOL_ERROR)  # malformed (8.1)
            else:
                s.remote_open = False
                yield StreamEnded(s)
                if not s.local_open:
                    self._discard(s)
            return
        if not sid & 1:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on an even stream id")
        if sid <= self.last_stream_id:
            if self.closed_streams.never_used(sid):  # RFC 9113 5.1.1
                raise ProtocolError(PROTOCOL_ERROR, "HEADERS on a stream id lower than one opened")
            self._closed_stream_frame(sid)
            return
        if sid > self.last_stream_id + 2:
            self.closed_streams.skipped(self.last_stream_id, sid)
        self.last_stream_id = sid
        if self.goaway_sent or len(self.streams) >= self.max_concurrent_streams:
            self._refuse(sid, REFUSED_STREAM)
            return
        if decoded.skipped:  # too many fields to decode, and the table needs none of them
            self._refuse(sid, ENHANCE_YOUR_CALM)
            return
        verdict = decoded.verdict
        why, content_length = verdict if verdict is not None else decoded.request_verdict(self.good_fields)
        if why is not None or (end_stream and content_length > 0):
            log.debug("gRPC stream %d malformed: %s", sid, why or "content-length without DATA")
            self._refuse(sid, PROTOCOL_ERROR)
            return
        self.last_active = self._clock()
        if content_length < 0:
            yield RequestReceived(sid, decoded.headers, end_stream, decoded.size)
        else:
            self._content_length = content_length  # for ``accept``
            yield RequestReceived(sid, decoded.headers, end_stream, decoded.size)
            self._content_length = -1
        s = self.streams.get(sid)
        if end_stream and s is not None:  # accepted, and not answered at once
            yield StreamEnded(s)

    def _refuse(self, sid: int, code: int) -> None:
        """Reset a stream that was never served (refused, or malformed): counted as a reset the
        client caused, unless the connection is going away."""
        self._write(frame(RST_STREAM, 0, sid, U32.pack(code)))
        self.closed_streams.reset(sid)
        if not self.goaway_sent and self.budgets.reset():
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many streams reset")

    # ---------------------------------------------------------------------- commands

    def accept(self, stream_id: int, end_stream: bool, owner: Any = None) -> StreamState:
        """Serve the stream of a ``RequestReceived`` (before handling the next event); its
        events carry its state, whose ``owner`` (the layer above's object) is ``owner``."""
        s = StreamState(stream_id, self.outbound.initial_window, self._clock(), owner)
        s.remote_open = not end_stream
        s.content_left = self._content_length
        self.streams[stream_id] = s
        self.idle_since = None
        return s

    def reject(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        """Answer a ``RequestReceived`` with a header block alone (an HTTP status), without
        serving it; the client is told to stop sending (RST_STREAM NO_ERROR) if it had not."""
        self._write(self.outbound.header_frames(stream_id, block, True))
        if not end_stream:
            self._write(frame(RST_STREAM, 0, stream_id, b"\x00\x00\x00\x00"))
        if not end_stream:
            self.closed_streams.reset(stream_id)

    def consumed(self, s: StreamState, n: int) -> None:
        """The layer above has taken ``n`` bytes of DATA: give the window back in batches."""
        s.recv_unacked += n
        if s.recv_unacked >= STREAM_WINDOW // 4 and s.remote_open and s.id in self.streams:
            self._write(frame(WINDOW_UPDATE, 0, s.id, U32.pack(s.recv_unacked)))
            s.recv_window += s.recv_unacked
            s.recv_unacked = 0

    def reset(self, s: StreamState, code: int) -> None:
        """End a stream with RST_STREAM (from our side)."""
        if self.streams.pop(s.id, None) is None:
            return
        self.outbound.forget(s.id)
        was_open = s.local_open or s.remote_open
        s.local_open = s.remote_open = False
        s.outbox = None
        self._write(frame(RST_STREAM, 0, s.id, U32.pack(code)))
        self.closed_streams.reset(s.id)
        if was_open:
            self._pending.append(StreamReset(s))
        self._pending.append(StreamWritable(s))
        # counted when the client caused it (an error code), not for our own early replies
        # (NO_ERROR: the call is over) nor while the connection is going away
        if code != NO_ERROR and not self.goaway_sent and self.budgets.reset() and not self.closed:
            self.close(ENHANCE_YOUR_CALM, "too many streams reset")
            return
        self._after_close()

    def _local_end(self, s: StreamState) -> None:
        """Our side of the stream ended (its trailers were written)."""
        if s.remote_open:
            # a reply before the client finished sending (an error, a refusal): tell it to stop
            self.reset(s, NO_ERROR)
            return
        self._discard(s)

    def _drained(self, s: StreamState) -> None:  # the outbound half's: an outbox emptied
        self._pending.append(StreamWritable(s))

    def _discard(self, s: StreamState) -> None:
        if self.streams.pop(s.id, None) is not None:
            self._after_close()

    def _after_close(self) -> None:
        if not self.streams:
            self.last_active = self._clock()
            if self.peer_goaway or self.goaway_sent:
                self.close()
            else:
                self.idle_since = self.last_active
