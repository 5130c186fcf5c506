"""HPACK (RFC 7541) for the builtin HTTP/2 server: reply blocks written as literals that never
touch the dynamic table (no encoder state), and request blocks decoded by the ``hpack`` library
behind a per-connection cache (``HeaderDecoder``)."""

from __future__ import annotations

from typing import cast

import hpack

from seqserve.api.transport.h2_frames import (
    BLOCK_CACHE,
    ENHANCE_YOUR_CALM,
    HPACK_LIST_CAP,
    MAX_HEADER_FIELDS,
    ProtocolError,
)

Headers = list[tuple[bytes, bytes]]

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


STATUS_200 = b"\x88"  # static table index 8


# ---------------------------------------------------------------- HPACK (walking a block)


def field_count(block: bytes) -> int:
    """How many header fields an HPACK block holds, counted without decoding (RFC 7541 6): the
    representations are walked and string literals skipped by their lengths. A malformed block
    counts as what was walked; hpack refuses it after."""
    i, n, fields = 0, len(block), 0
    while i < n and fields <= MAX_HEADER_FIELDS:
        b = block[i]
        if b & 0x80:  # indexed field
            i = _skip_int(block, i, 7)
            fields += 1
            continue
        if b & 0xE0 == 0x20:  # dynamic table size update
            i = _skip_int(block, i, 5)
            continue
        prefix = 6 if b & 0x40 else 4  # literal with incremental indexing, or without / never
        new_name = b & ((1 << prefix) - 1) == 0
        i = _skip_int(block, i, prefix)
        if new_name:
            i = _skip_string(block, i)
        i = _skip_string(block, i)
        fields += 1
    return fields


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


class HeaderDecoder:
    """One connection's HPACK decoder. Every block is decoded in order, so that the dynamic table
    keeps in step. A client sends the same block call after call once its headers are in the
    table (only indexed fields and literals the table does not keep): such a block decodes to
    the same list while the table is unchanged, so the list is kept (at most ``BLOCK_CACHE`` of
    them) until the table changes. Decoding costs 10-20 µs in ``hpack``'s Python; a hit, a dict
    lookup."""

    __slots__ = ("_blocks", "decoder")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=HPACK_LIST_CAP)
        self._blocks: dict[bytes, Headers] = {}

    def decode(self, block: bytes) -> Headers:
        """The header list of ``block``; ProtocolError past MAX_HEADER_FIELDS fields, hpack's
        HPACKError when it does not decode."""
        hit = self._blocks.get(block)
        if hit is not None:
            return hit
        if field_count(block) > MAX_HEADER_FIELDS:
            raise ProtocolError(ENHANCE_YOUR_CALM, f"header block of more than {MAX_HEADER_FIELDS} fields")
        if not _CACHE_BLOCKS:
            return cast(Headers, self.decoder.decode(block, raw=True))
        table = self.decoder.header_table
        entries = table.dynamic_entries  # hpack's: a new tuple at the front on each insertion
        size, first, maxsize = len(entries), entries[0] if entries else None, table.maxsize
        headers = cast(Headers, self.decoder.decode(block, raw=True))
        if len(entries) != size or (entries[0] if entries else None) is not first or table.maxsize != maxsize:
            self._blocks.clear()  # the table changed: every list kept may be stale
        elif len(block) <= 1024:
            if len(self._blocks) >= BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = headers
        return headers
