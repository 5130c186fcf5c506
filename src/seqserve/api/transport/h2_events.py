"""What ``H2Connection`` tells the layer above: one small object per thing that happened, in
the order it happened (``H2Connection.receive_data`` yields them). A stream's event carries
the stream's state (``StreamState``: its id, its halves, and the layer above's ``owner``)."""

from __future__ import annotations

from seqserve.api.transport.h2_outbound import StreamState


class RequestReceived:
    """A new stream's request headers, well-formed (RFC 9113 8.1-8.3). The layer above answers
    it at once with ``accept`` (the stream is served), ``reject`` (an HTTP-level refusal), or
    neither (nothing to serve). ``header_list_size`` is the list's size as
    SETTINGS_MAX_HEADER_LIST_SIZE counts it: the layer above refuses a request over the limit."""

    __slots__ = ("end_stream", "header_list_size", "headers", "stream_id")

    def __init__(
        self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool, header_list_size: int = 0
    ) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.end_stream = end_stream
        self.header_list_size = header_list_size


class DataReceived:
    """DATA on an accepted stream: ``data`` without padding, ``flow_length`` what it counted
    against the windows. The layer above gives the window back with ``consumed``."""

    __slots__ = ("data", "flow_length", "stream")

    def __init__(self, stream: StreamState, data: bytes, flow_length: int) -> None:
        self.stream = stream
        self.data = data
        self.flow_length = flow_length


class StreamEnded:
    """The client half-closed the stream (END_STREAM)."""

    __slots__ = ("stream",)

    def __init__(self, stream: StreamState) -> None:
        self.stream = stream


class StreamReset:
    """The stream ended abnormally: the client or this side reset it, or the connection ended."""

    __slots__ = ("stream",)

    def __init__(self, stream: StreamState) -> None:
        self.stream = stream


class StreamWritable:
    """A stream's outbox emptied or the stream closed: a writer waiting on it looks again."""

    __slots__ = ("stream",)

    def __init__(self, stream: StreamState) -> None:
        self.stream = stream


class SettingsChanged:
    """The client's SETTINGS, applied (and acknowledged): ``changes`` maps setting to value."""

    __slots__ = ("changes",)

    def __init__(self, changes: dict[int, int]) -> None:
        self.changes = changes


class PingAcknowledged:
    """A PING this side sent was answered."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class ConnectionTerminated:
    """This side ended the connection: a GOAWAY with ``error_code`` is queued and the
    connection accepts nothing more (an error code: the client broke a connection rule)."""

    __slots__ = ("error_code", "message")

    def __init__(self, error_code: int, message: str) -> None:
        self.error_code = error_code
        self.message = message


Event = (
    RequestReceived
    | DataReceived
    | StreamEnded
    | StreamReset
    | StreamWritable
    | SettingsChanged
    | PingAcknowledged
    | ConnectionTerminated
)
