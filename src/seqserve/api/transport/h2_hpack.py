"""HPACK (RFC 7541) for the builtin HTTP/2 server: reply blocks written as literals that never
touch the dynamic table (no encoder state), and request blocks decoded by the ``hpack`` library
behind a per-connection cache (``HeaderDecoder``)."""

from __future__ import annotations

from typing import cast

import hpack
import hpack.exceptions

from seqserve.api.transport.h2_fields import request_error
from seqserve.api.transport.h2_frames import (
    BLOCK_CACHE,
    ENHANCE_YOUR_CALM,
    FIELDS_PER_FRAME,
    MAX_HEADER_FIELDS,
    ProtocolError,
)

Headers = list[tuple[bytes, bytes]]

#: the size of the pieces a large block is decoded in (``walk``)
SEGMENT_BYTES = 1024
#: hpack's bound on the list one piece decodes to: indexed fields of the largest entries (4 KiB,
#: the default table) add up to this for a piece of SEGMENT_BYTES; they are references
SEGMENT_LIST_CAP = 4097 * SEGMENT_BYTES

#: the cache reads hpack's table (``header_table.dynamic_entries``, ``maxsize``: hpack 4.x);
#: without them every block is decoded
_CACHE_BLOCKS = all(hasattr(hpack.Decoder().header_table, a) for a in ("dynamic_entries", "maxsize"))


# ---------------------------------------------------------------------- HPACK (encoding)


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first`` holding the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding: the encoder
    never inserts into the dynamic table, so a reply block needs no per-connection state."""
    return b"\x00" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (RFC 7541 6.3), for the start of a header block."""
    return hpack_int(size, 5, 0x20)


#: the dynamic table size both sides start with (RFC 7541 4.2, SETTINGS_HEADER_TABLE_SIZE)
DEFAULT_TABLE_SIZE = 4096
STATUS_200 = b"\x88"  # static table index 8


# ---------------------------------------------------------------- HPACK (walking a block)


class BlockShape:
    """A header block walked without decoding (RFC 7541 6): its fields, whether it changes the
    dynamic table (a literal with incremental indexing, a size update), and its pieces."""

    __slots__ = ("fields", "pieces", "touches_table")

    def __init__(self, pieces: list[bytes], fields: int, touches_table: bool) -> None:
        self.pieces = pieces
        self.fields = fields
        self.touches_table = touches_table


def walk(block: bytes) -> BlockShape:
    """``block`` cut at field boundaries into pieces of about SEGMENT_BYTES: hpack copies the
    rest of what it is given for every literal it decodes, so a block given whole costs fields
    x bytes; given in pieces, it costs its length. A dynamic table size update after a field is
    refused here (hpack sees each piece as a block of its own); a malformed block is cut where
    the walk ends, and hpack refuses it."""
    i, n, start = 0, len(block), 0
    fields = 0
    touches = False
    out = []
    while i < n:
        b = block[i]
        if b & 0x80:  # indexed field
            i = _skip_int(block, i, 7)
            fields += 1
        elif b & 0xE0 == 0x20:  # dynamic table size update
            if fields:
                raise hpack.exceptions.HPACKDecodingError("table size update after a header field")
            i = _skip_int(block, i, 5)
            touches = True
            continue
        else:
            indexing = bool(b & 0x40)  # literal with incremental indexing, or without / never
            touches = touches or indexing
            prefix = 6 if indexing else 4
            new_name = b & ((1 << prefix) - 1) == 0
            i = _skip_int(block, i, prefix)
            if new_name:
                i = _skip_string(block, i)
            i = _skip_string(block, i)
            fields += 1
        if i - start >= SEGMENT_BYTES:
            out.append(block[start:i])
            start = i
    if start < n:
        out.append(block[start:])
    return BlockShape(out, fields, touches)


def _int_at(block: bytes, i: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer at ``i``: (value, index after it); at most 5 continuation bytes."""
    limit = (1 << prefix) - 1
    value = block[i] & limit
    i += 1
    if value < limit:
        return value, i
    shift = 0
    while i < len(block) and shift <= 28:
        b = block[i]
        i += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value, i


def _skip_int(block: bytes, i: int, prefix: int) -> int:
    return _int_at(block, i, prefix)[1]


def _skip_string(block: bytes, i: int) -> int:
    if i >= len(block):
        return i
    length, i = _int_at(block, i, 7)
    return i + length


class HeaderBlock:
    """A decoded header block: its fields, its size as SETTINGS_MAX_HEADER_LIST_SIZE counts it
    (RFC 9113 6.5.2: name, value and 32 per field), and the connection's verdict on it as a
    request (a cached block keeps it). A block of more than
    MAX_HEADER_FIELDS fields that leaves the table alone is not decoded: ``skipped``, no
    headers, its request refused."""

    __slots__ = ("headers", "size", "skipped", "verdict")

    def __init__(self, headers: Headers, *, skipped: bool = False) -> None:
        self.headers = headers
        self.size = sum(len(n) + len(v) for n, v in headers) + 32 * len(headers)
        self.skipped = skipped
        self.verdict: tuple[str | None, int] | None = None

    def request_verdict(self, known_good: set[tuple[bytes, bytes]] | None = None) -> tuple[str | None, int]:
        """``h2_fields.request_error`` of the headers, worked out once."""
        verdict = self.verdict
        if verdict is None:
            verdict = self.verdict = request_error(self.headers, known_good)
        return verdict


class HeaderDecoder:
    """One connection's HPACK decoder. Every block is decoded in order, so that the dynamic table
    keeps in step. A client sends the same block call after call once its headers are in the
    table (only indexed fields and literals the table does not keep): such a block decodes to
    the same list while the table is unchanged, so the list is kept (at most ``BLOCK_CACHE`` of
    them) until the table changes. Decoding costs 10-20 µs in ``hpack``'s Python; a hit, a dict
    lookup. Indexed fields decode to the table's own strings (no copy), so a block's decoded
    size is bounded by its length and the table's, whatever it adds up to; the caller refuses
    the request when its ``size`` is over the limit, after the table was kept in step."""

    __slots__ = ("_blocks", "decoder", "fields_decoded")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=SEGMENT_LIST_CAP)
        self._blocks: dict[bytes, HeaderBlock] = {}
        self.fields_decoded = 0  # since the caller last reset it (a cached block costs none)

    def decode(self, block: bytes) -> HeaderBlock:
        """The decoded ``block``; hpack's HPACKError when it does not decode."""
        hit = self._blocks.get(block)
        if hit is not None:
            return hit
        if not _CACHE_BLOCKS:
            return self._decode(block)
        table = self.decoder.header_table
        entries = table.dynamic_entries  # hpack's: a new tuple at the front on each insertion
        size, first, maxsize = len(entries), entries[0] if entries else None, table.maxsize
        decoded = self._decode(block)
        if len(entries) != size or (entries[0] if entries else None) is not first or table.maxsize != maxsize:
            self._blocks.clear()  # the table changed: every list kept may be stale
        elif len(block) <= 1024:
            if len(self._blocks) >= BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = decoded
        return decoded

    def cost_in_frames(self) -> int:
        """The fields decoded since the last call, weighed as frames of a receive turn (a cached
        block costs none)."""
        n, self.fields_decoded = self.fields_decoded, 0
        return n // FIELDS_PER_FRAME

    def _decode(self, block: bytes) -> HeaderBlock:
        decode = self.decoder.decode
        if len(block) <= SEGMENT_BYTES:  # at most SEGMENT_BYTES fields
            fields = cast(Headers, decode(block, raw=True))
            self.fields_decoded += len(fields)
            return HeaderBlock(fields)
        shape = walk(block)
        if shape.fields > MAX_HEADER_FIELDS:
            if shape.touches_table:  # the table must stay in step: the connection cannot go on
                raise ProtocolError(ENHANCE_YOUR_CALM, f"a header block of more than {MAX_HEADER_FIELDS} fields")
            return HeaderBlock([], skipped=True)
        headers: Headers = []
        for piece in shape.pieces:
            headers += cast(Headers, decode(piece, raw=True))
        self.fields_decoded += shape.fields
        return HeaderBlock(headers)
