"""Raw senders and the checks every hostile exchange must pass.

HTTP goes over a plain socket (so malformed framing, odd paths and duplicate headers reach the
server exactly as written) and gRPC over generic channel methods with identity serializers (so
undecodable protobuf reaches the server too). Every socket and every call has a timeout: a hang
is reported as a failure of the case, never as a hung test run.

The rules checked (issue 11, protocol.md 4.1 / 4.2):
* HTTP: a status from the case's expected set, answered within the bound; anything but 200
  carries a non-empty JSON body `{"error": "<message>"}`. 5xx is never expected for a client
  fault; the one exception a case may list is 501, Triton's answer for UNSUPPORTED (the HTTP
  twin of gRPC UNIMPLEMENTED, which the issue allows), and 503 for a disabled API (UNAVAILABLE).
* gRPC: OK (where the case allows a valid success) or a status from ALLOWED_GRPC; never
  UNKNOWN or INTERNAL for a client fault, never DEADLINE_EXCEEDED (that is a hang).
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

#: a hostile request must be answered within this many seconds (unless its case says otherwise)
ANSWER_BOUND_S = 5.0
#: every socket read/write gives up after this long; always longer than any bound checked
SOCKET_TIMEOUT_S = 15.0

Code = grpc.StatusCode
#: the statuses a client fault may get (issue 11); OK is allowed per case, for valid successes
ALLOWED_GRPC = frozenset(
    {
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.UNIMPLEMENTED,
        Code.RESOURCE_EXHAUSTED,
        Code.PERMISSION_DENIED,
        Code.UNAVAILABLE,
    }
)
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_retries", 0),
]
SERVICE = "/inference.GRPCInferenceService/"

# ------------------------------------------------------------------------------ HTTP


@dataclass
class HttpReply:
    """What came back: a parsed response, or status None with why there was none."""

    status: int | None
    headers: dict[str, str]  # lower-case names (the last value of a repeated header)
    body: bytes
    elapsed: float
    error: str = ""

    def describe(self) -> str:
        if self.status is None:
            return f"no HTTP response ({self.error}) after {self.elapsed:.2f} s"
        return f"HTTP {self.status} after {self.elapsed:.2f} s: {self.body[:300]!r}"


Headers = Sequence[tuple[str, str]] | dict[str, str]


def http_bytes(
    method: str,
    path: str | bytes,
    body: bytes = b"",
    headers: Headers = (),
    *,
    content_length: bool = True,
) -> bytes:
    """One HTTP/1.1 request as bytes. A Content-Length is added unless the headers frame the
    body themselves (Content-Length or Transfer-Encoding) or content_length is False. Every
    request asks the server to close the connection after answering."""
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    framed = any(k.lower() in ("content-length", "transfer-encoding") for k, _ in items)
    if content_length and not framed:
        items.append(("Content-Length", str(len(body))))
    p = path if isinstance(path, bytes) else path.encode("latin-1")
    head = [method.encode("latin-1") + b" " + p + b" HTTP/1.1", b"Host: 127.0.0.1"]
    head += [k.encode("latin-1") + b": " + v.encode("latin-1") for k, v in items]
    head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def send_raw(
    port: int,
    parts: bytes | Iterable[bytes],
    *,
    method: str = "POST",
    timeout: float = SOCKET_TIMEOUT_S,
    gap_s: float = 0.0,
) -> HttpReply:
    """Send raw bytes (or parts, `gap_s` apart) on a new connection and read one response."""
    t0 = time.monotonic()
    chunks = [parts] if isinstance(parts, bytes) else list(parts)
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError as e:
        return HttpReply(None, {}, b"", time.monotonic() - t0, f"connect failed: {e}")
    try:
        for i, chunk in enumerate(chunks):
            if i and gap_s:
                time.sleep(gap_s)
            try:
                sock.sendall(chunk)
            except TimeoutError:
                break  # the server stopped reading; it may still have answered
            except OSError:
                break  # it answered early and closed, or reset: read what is there
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
            body = resp.read()
        except TimeoutError:
            return HttpReply(None, {}, b"", time.monotonic() - t0, f"no answer within {timeout} s")
        except (http.client.HTTPException, OSError) as e:
            return HttpReply(None, {}, b"", time.monotonic() - t0, f"connection closed: {type(e).__name__}: {e}")
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return HttpReply(resp.status, headers, body, time.monotonic() - t0)
    finally:
        sock.close()


def http_send(
    port: int,
    method: str,
    path: str | bytes,
    body: bytes | dict[str, Any] | list[Any] = b"",
    headers: Headers = (),
    *,
    timeout: float = SOCKET_TIMEOUT_S,
) -> HttpReply:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return send_raw(port, http_bytes(method, path, body, headers), method=method, timeout=timeout)


def error_message(reply: HttpReply) -> str:
    """The message of a `{"error": "..."}` body; fails on anything else."""
    assert reply.body, f"empty error body: {reply.describe()}"
    try:
        doc = json.loads(reply.body)
    except ValueError:
        raise AssertionError(f"error body is not JSON: {reply.describe()}") from None
    assert isinstance(doc, dict) and set(doc) == {"error"}, f"error body is not {{'error': ...}}: {reply.describe()}"
    assert isinstance(doc["error"], str) and doc["error"], f"empty error message: {reply.describe()}"
    return str(doc["error"])


def assert_clean_http(
    reply: HttpReply, expect: Iterable[int], bound: float = ANSWER_BOUND_S, *, empty_ok: bool = False
) -> None:
    """The reply has an expected status, in time; an error carries {"error": ...} (``empty_ok``:
    or no body at all, for errors the HTTP server's parser answers before the app runs)."""
    allowed = set(expect)
    assert reply.status is not None, reply.describe()
    assert reply.status in allowed, f"expected {sorted(allowed)}, got {reply.describe()}"
    if reply.status != 200 and not (empty_ok and not reply.body):
        error_message(reply)
    assert reply.elapsed <= bound, f"answered after {reply.elapsed:.2f} s (bound {bound} s): {reply.describe()}"


def infer_doc(reply: HttpReply) -> tuple[dict[str, Any], bytes]:
    """A 200 infer reply as (JSON header, binary tail); fails if it is malformed."""
    ihcl = reply.headers.get("inference-header-content-length")
    n = int(ihcl) if ihcl is not None else len(reply.body)
    assert 0 <= n <= len(reply.body), f"bad Inference-Header-Content-Length {ihcl}: {reply.describe()}"
    try:
        doc = json.loads(reply.body[:n])
    except ValueError:
        raise AssertionError(f"200 reply is not JSON: {reply.describe()}") from None
    assert isinstance(doc, dict) and isinstance(doc.get("outputs"), list), f"no outputs: {reply.describe()}"
    return doc, reply.body[n:]


def output_values(reply: HttpReply, name: str = "OUTPUT") -> list[Any]:
    """Values of one output of a 200 infer reply (JSON data, or FP32 binary)."""
    doc, tail = infer_doc(reply)
    offset = 0
    for out in doc["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["name"] == name:
            if size is None:
                return list(out["data"])
            assert out["datatype"] == "FP32", out
            return list(struct.unpack(f"<{size // 4}f", tail[offset : offset + size]))
        offset += size or 0
    raise AssertionError(f"no output {name!r} in {doc}")


# ------------------------------------------------------------------------------ gRPC


@dataclass
class GrpcReply:
    code: grpc.StatusCode
    details: str
    payload: bytes | None
    elapsed: float

    def describe(self) -> str:
        return f"{self.code.name} after {self.elapsed:.2f} s: {self.details[:300]!r}"


def as_bytes(msg: Any) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def grpc_unary(channel: grpc.Channel, method: str, payload: Any, *, timeout: float = SOCKET_TIMEOUT_S) -> GrpcReply:
    """One unary call with raw bytes (messages are serialized here): the server sees exactly
    these bytes."""
    call = channel.unary_unary(SERVICE + method if not method.startswith("/") else method)
    t0 = time.monotonic()
    try:
        out = call(as_bytes(payload), timeout=timeout)
    except grpc.RpcError as e:
        return GrpcReply(e.code(), e.details() or "", None, time.monotonic() - t0)
    return GrpcReply(Code.OK, "", out, time.monotonic() - t0)


def assert_clean_grpc(reply: GrpcReply, expect: Iterable[grpc.StatusCode], bound: float = ANSWER_BOUND_S) -> None:
    allowed = set(expect)
    assert reply.code != Code.DEADLINE_EXCEEDED, f"no answer (hang): {reply.describe()}"
    assert reply.code in allowed, f"expected {sorted(c.name for c in allowed)}, got {reply.describe()}"
    if reply.code != Code.OK:
        assert reply.code in ALLOWED_GRPC, f"{reply.code.name} is never the answer to a client fault"
        assert reply.details, f"no error message: {reply.describe()}"
    assert reply.elapsed <= bound, f"answered after {reply.elapsed:.2f} s (bound {bound} s): {reply.describe()}"


@dataclass
class StreamEvent:
    """One thing a stream did: a reply (message set) or its end (code set)."""

    at: float
    message: service_pb2.ModelStreamInferResponse | None = None
    code: grpc.StatusCode | None = None
    details: str = ""
    raw: bytes = b""

    def describe(self) -> str:
        if self.message is not None:
            m = self.message
            return f"reply id={m.infer_response.id!r} error={m.error_message[:200]!r}"
        return f"stream ended {self.code.name if self.code else '?'}: {self.details[:300]!r}"


class RawStream:
    """ModelStreamInfer with raw payloads: `send(bytes or message)`, `next_event(timeout)`.
    A reader thread turns replies and the stream's end into StreamEvents."""

    def __init__(self, channel: grpc.Channel, *, deadline_s: float = 120.0) -> None:
        self._out: queue.Queue[bytes | None] = queue.Queue()
        self.events: queue.Queue[StreamEvent] = queue.Queue()
        self.ended: StreamEvent | None = None
        method = channel.stream_stream(SERVICE + "ModelStreamInfer")
        self._call = method(self._requests(), timeout=deadline_s)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self._out.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for raw in self._call:
                try:
                    msg = service_pb2.ModelStreamInferResponse.FromString(raw)
                except Exception:  # an unparsable reply is reported as such by the checks
                    msg = service_pb2.ModelStreamInferResponse(error_message="<unparsable reply>")
                self.events.put(StreamEvent(time.monotonic(), message=msg, raw=raw))
            self.events.put(StreamEvent(time.monotonic(), code=Code.OK))
        except grpc.RpcError as e:
            self.events.put(StreamEvent(time.monotonic(), code=e.code(), details=e.details() or ""))

    def send(self, payload: Any) -> None:
        self._out.put(as_bytes(payload))

    def close_send(self) -> None:
        self._out.put(None)

    def next_event(self, timeout: float) -> StreamEvent | None:
        """The next reply or the end; None if the stream stayed silent for `timeout` s."""
        if self.ended is not None:
            return self.ended
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if ev.message is None:
            self.ended = ev
        return ev

    def cancel(self) -> None:
        self._out.put(None)
        self._call.cancel()
        self._reader.join(5)


# --------------------------------------------------------------- requests to build on

FP32_ONE = struct.pack("<f", 1.0)


def acc_input(value: float = 1.0, **over: Any) -> dict[str, Any]:
    return {"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value], **over}


def seq_params(sid: int | str, start: bool = True, end: bool = True, **extra: Any) -> dict[str, Any]:
    return {"sequence_id": sid, "sequence_start": start, "sequence_end": end, **extra}


def acc_request(
    sid: int | str | None = None,
    value: float = 1.0,
    *,
    model: str = "accumulator",
    start: bool = True,
    end: bool = True,
    rid: str = "",
) -> service_pb2.ModelInferRequest:
    """A valid ModelInferRequest for the accumulator models (one FP32 [1, 1] step)."""
    r = service_pb2.ModelInferRequest(model_name=model, id=rid)
    r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    r.raw_input_contents.append(struct.pack("<f", value))
    if sid is not None:
        if isinstance(sid, str):
            r.parameters["sequence_id"].string_param = sid
        else:
            r.parameters["sequence_id"].int64_param = sid if sid < 2**63 else sid - 2**64
        r.parameters["sequence_start"].bool_param = start
        r.parameters["sequence_end"].bool_param = end
    return r


def stream_reply_value(msg: service_pb2.ModelStreamInferResponse | service_pb2.ModelInferResponse) -> float:
    resp = msg.infer_response if isinstance(msg, service_pb2.ModelStreamInferResponse) else msg
    assert len(resp.raw_output_contents) == len(resp.outputs), resp
    (i,) = [k for k, o in enumerate(resp.outputs) if o.name == "OUTPUT"]
    return float(struct.unpack("<f", resp.raw_output_contents[i][:4])[0])


# ------------------------------------------------------------------- bodies


def infer_path(model: str = "accumulator", version: str | None = None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"


def bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def gzip_bomb(inflated: int, prefix: bytes = b"") -> bytes:
    """A gzip member that inflates to len(prefix) + `inflated` bytes (spaces), built from one
    compressed 1 MiB block repeated: a full flush makes each block independent."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    chunk = b" " * (1 << 20)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH) == block
    n, rest = divmod(inflated, len(chunk))
    tail = c.compress(b" " * rest) + c.flush(zlib.Z_FINISH)
    crc = zlib.crc32(prefix)
    for _ in range(n):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(b" " * rest, crc)
    size = (len(prefix) + inflated) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + head + block * n + tail + struct.pack("<II", crc & 0xFFFFFFFF, size)


def zlib_bomb(inflated: int, prefix: bytes = b"") -> bytes:
    """The same as a zlib (RFC 1950) stream: Content-Encoding deflate."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    chunk = b" " * (1 << 20)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    n, rest = divmod(inflated, len(chunk))
    tail = c.compress(b" " * rest) + c.flush(zlib.Z_FINISH)
    adler = zlib.adler32(prefix)
    for _ in range(n):
        adler = zlib.adler32(chunk, adler)
    adler = zlib.adler32(b" " * rest, adler)
    return b"\x78\xda" + head + block * n + tail + struct.pack(">I", adler & 0xFFFFFFFF)


BOMB_PREFIX = b'{"inputs":[{"name":"INPUT","datatype":"FP32","shape":[1,1],"data":[1.0]}],"id":"'


# ------------------------------------------------------------- protobuf, by hand


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    """One protobuf field: wire type 0 takes an int, type 2 a byte string (length added)."""
    key = varint((number << 3) | wire_type)
    if wire_type == 0:
        assert isinstance(payload, int)
        return key + varint(payload)
    assert isinstance(payload, bytes)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload
