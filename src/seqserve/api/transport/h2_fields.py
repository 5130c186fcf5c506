"""The field rules of an HTTP/2 request (RFC 9113 8.1-8.3): what makes a request's or its
trailers' header list malformed. A malformed request is a stream error PROTOCOL_ERROR (8.1.1):
the connection and its other streams go on. No state: ``H2Connection`` calls these on each
decoded list (and keeps the verdict with a cached block)."""

from __future__ import annotations

Headers = list[tuple[bytes, bytes]]

#: the request pseudo-header fields (8.3.1); each at most once. Not ``:protocol``: the server
#: does not send SETTINGS_ENABLE_CONNECT_PROTOCOL, so it is malformed here (RFC 8441 4)
REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
#: connection-specific fields, which HTTP/2 forbids (8.2.2)
CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))
#: the bytes a field name may hold: RFC 9110 token characters, lowercase (8.2.1)
_NAME_CHARS = bytes(sorted(set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")))
_ALL = bytes(range(256))
_NAME_BAD = bytes(c for c in _ALL if c not in _NAME_CHARS)
#: a value must not hold NUL, CR or LF, nor start or end with space or tab (8.2.1)
_VALUE_BAD = b"\x00\r\n"
_EDGE = (b" ", b"\t")
#: regular fields a connection keeps as found well-formed (``request_error``)
KNOWN_GOOD = 256


def name_error(name: bytes) -> str | None:
    """Why a regular field name is malformed (empty, uppercase, a separator or a control byte)."""
    if not name:
        return "an empty field name"
    if name.translate(None, _NAME_CHARS):
        if name.lower() != name:
            return "an uppercase field name"
        return "a field name with a character outside a token"
    return None


def value_error(value: bytes) -> str | None:
    if value:
        if value[:1] in _EDGE or value[-1:] in _EDGE:
            return "a field value with leading or trailing whitespace"
        for b in _VALUE_BAD:
            if b in value:
                return "a field value with NUL, CR or LF"
    return None


def request_error(headers: Headers, known_good: set[tuple[bytes, bytes]] | None = None) -> tuple[str | None, int]:
    """(why the request's header list is malformed or None, its content-length or -1).
    ``known_good``: regular fields found well-formed before (a connection's calls repeat most
    of theirs), skipped; the fields found well-formed now are added (at most KNOWN_GOOD)."""
    seen: set[bytes] = set()
    method = path = b""
    regular = False
    content_length = -1
    for field in headers:
        name, value = field
        if name[:1] == b":":
            if regular:
                return "a pseudo-header field after a regular field", -1
            if name not in REQUEST_PSEUDO:
                return f"the pseudo-header field {name[:40]!r} in a request", -1
            if name in seen:
                return f"{name.decode()} more than once", -1
            seen.add(name)
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            continue
        regular = True
        if known_good is not None and field in known_good:
            continue
        why = name_error(name) or value_error(value) or connection_error(name, value)
        if why is not None:
            return why, -1
        if name == b"content-length":
            length = _content_length(value)
            if length < 0 or (content_length >= 0 and length != content_length):
                return "an invalid content-length", -1
            content_length = length
        elif known_good is not None:
            if len(known_good) >= KNOWN_GOOD:
                known_good.clear()
            known_good.add(field)
    if b":method" not in seen:
        return "no :method", -1
    if method == b"CONNECT":
        if b":scheme" in seen or b":path" in seen or b":authority" not in seen:
            return "a CONNECT request with :scheme or :path, or without :authority", -1
        return None, content_length
    if b":scheme" not in seen:
        return "no :scheme", -1
    if not path:
        return "an empty or missing :path", -1
    return None, content_length


def trailers_error(headers: Headers) -> str | None:
    """Why a request's trailers are malformed (pseudo-header fields, or field rules)."""
    for name, value in headers:
        if name[:1] == b":":
            return "a pseudo-header field in trailers"
        why = name_error(name) or value_error(value) or connection_error(name, value)
        if why is not None:
            return why
    return None


def connection_error(name: bytes, value: bytes) -> str | None:
    if name in CONNECTION_SPECIFIC:
        return f"the connection-specific field {name.decode()}"
    if name == b"te" and value != b"trailers":
        return "te other than trailers"
    return None


def _content_length(value: bytes) -> int:
    """A content-length's value, or -1 (a list of equal values counts once, RFC 9110 8.6)."""
    values = {v.strip() for v in value.split(b",")}
    if len(values) != 1:
        return -1
    text = values.pop()
    if not text.isdigit() or len(text) > 18:
        return -1
    return int(text)
