"""The sequence API's documents: what ``GET|DELETE /v2/models/{m}[/versions/{v}]/sequences[/{id}]``
answer (``api/http/routes.py`` routes them; the restrictable API group ``sequence``). See
docs/sequence-api.md.

A sequence id in a path is a uint64 when the segment is decimal digits and a string otherwise;
``?id_type=string`` makes a segment of digits a string id (uint64 5 and string "5" are
different sequences, as everywhere else), ``?id_type=uint64`` insists on a number. Strings are
percent-decoded, so any string id can be written (``%2F`` for ``/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqserve.engine import Code, EndedSequence, InferenceError, SequenceInfo, Server, parse_sequence_id

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000


def sequence_json(info: SequenceInfo) -> dict[str, Any]:
    return {
        "id": info.sequence_id,
        "id_type": "string" if isinstance(info.sequence_id, str) else "uint64",
        "session": info.session,
        "backlogged": info.backlogged,
        "instance": info.instance,
        "slot": info.slot,
        "age_s": round(info.age_s, 6),
        "idle_s": round(info.idle_s, 6),
        "steps": info.steps,
        "state_bytes": info.state_bytes,
        "queued_requests": info.queued,
    }


def _version(server: Server, model: str, version: str) -> dict[str, str]:
    m = server.model(model, version)
    return {"model": m.name, "version": m.version_str}


def list_doc(server: Server, model: str, version: str, query: Mapping[str, str]) -> dict[str, Any]:
    """``GET .../sequences[?limit=N]``: how many are live, and up to N of them, the oldest first."""
    raw = query.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or int(raw) > MAX_LIMIT:
        raise InferenceError(Code.INVALID_ARG, f"limit must be an integer from 0 to {MAX_LIMIT}, not '{raw}'")
    found = server.sequences(model, version, limit=int(raw))
    return {
        **_version(server, model, version),
        "total": found.total,
        "sequences": [sequence_json(i) for i in found.sequences],
    }


def show_doc(server: Server, model: str, version: str, segment: str, query: Mapping[str, str]) -> dict[str, Any]:
    """``GET .../sequences/{id}``: one live sequence."""
    sid = parse_sequence_id(segment, query.get("id_type", ""))
    return {**_version(server, model, version), **sequence_json(server.sequence(model, sid, version))}


def end_doc(server: Server, model: str, version: str, segment: str, query: Mapping[str, str]) -> dict[str, Any]:
    """``DELETE .../sequences/{id}``: end one live sequence now, as idle expiry does."""
    sid = parse_sequence_id(segment, query.get("id_type", ""))
    ended: EndedSequence = server.end_sequence(model, sid, version)
    return {
        **_version(server, model, version),
        "ended": sequence_json(ended.sequence),
        "final_step": ended.final_step,
        "cancelled_requests": ended.cancelled_requests,
    }
