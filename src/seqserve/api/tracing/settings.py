"""Trace settings as Triton has them: ``--trace-config [<mode>,]<setting>=<value>`` at startup,
and the trace extension's documents (``trace_level``, ``trace_rate``, ``trace_count``,
``log_frequency``, ``trace_file``, ``trace_mode``) at run time, global or per model. A model's
settings name only what was set for it; the rest follows the global ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from seqserve.engine import Code, InferenceError

LEVELS = ("TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
DEFAULT_RATE = 1000
DEFAULT_OTEL_URL = "http://localhost:4318/v1/traces"

#: the extension's setting names, and the TraceSetting field each one sets
SETTING_FIELDS = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
    "trace_file": "file",
}


@dataclass(frozen=True, slots=True)
class TraceSetting:
    """One set of trace settings (Triton's defaults: level OFF, rate 1000, count -1)."""

    level: frozenset[str] = frozenset()  # empty: OFF
    rate: int = DEFAULT_RATE  # every rate-th request is traced
    count: int = -1  # traces left to collect (-1: no end)
    log_frequency: int = 0  # triton mode: write the file every this many traces (0: at exit)
    file: str = ""  # triton mode: where traces go

    @property
    def active(self) -> bool:
        return bool(self.level) and self.count != 0


@dataclass(frozen=True, slots=True)
class OtelSettings:
    """``--trace-config opentelemetry,<setting>=<value>``: where the OTLP/HTTP exporter sends."""

    url: str = DEFAULT_OTEL_URL
    resource: tuple[tuple[str, str], ...] = ()  # extra resource attributes (key=value)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """What ``--trace-config`` said: the mode, the global settings, the exporter's."""

    mode: str = "triton"
    setting: TraceSetting = field(default_factory=TraceSetting)
    otel: OtelSettings = field(default_factory=OtelSettings)

    @classmethod
    def parse(cls, items: Iterable[str]) -> TraceConfig:
        """``--trace-config`` values; ValueError says which one is wrong and the accepted form."""
        mode = "triton"
        values: dict[str, Any] = {}
        levels: set[str] = set()
        otel: dict[str, Any] = {}
        resource: list[tuple[str, str]] = []
        for item in items:
            head, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--trace-config '{item}' is not [<mode>,]<setting>=<value>")
            scope, comma, key = head.partition(",")
            if not comma:
                scope, key = "", scope
            key, value = key.strip(), value.strip()
            if scope and scope not in MODES:
                raise ValueError(f"--trace-config '{item}': unknown mode '{scope}' (triton or opentelemetry)")
            if not scope:
                if key == "mode":
                    if value not in MODES:
                        raise ValueError(f"--trace-config mode='{value}': expected triton or opentelemetry")
                    mode = value
                elif key == "level":
                    levels |= _levels([value], "--trace-config level")
                elif key in ("rate", "count"):
                    values[key] = _int(value, f"--trace-config {key}", minimum=1 if key == "rate" else -1)
                else:
                    raise ValueError(f"--trace-config: unknown global setting '{key}' (rate, level, count, mode)")
            elif scope == "triton":
                if key == "file":
                    values["file"] = value
                elif key == "log-frequency":
                    values["log_frequency"] = _int(value, "--trace-config triton,log-frequency", minimum=0)
                else:
                    raise ValueError(f"--trace-config: unknown triton setting '{key}' (file, log-frequency)")
            elif key == "url":
                otel["url"] = value
            elif key == "resource":
                rkey, rsep, rvalue = value.partition("=")
                if not rsep or not rkey:
                    raise ValueError(f"--trace-config opentelemetry,resource='{value}' is not <key>=<value>")
                resource.append((rkey, rvalue))
            elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
                name = "bsp_schedule_delay_ms" if key == "bsp_schedule_delay" else key
                otel[name] = _int(value, f"--trace-config opentelemetry,{key}", minimum=1)
            else:
                raise ValueError(
                    f"--trace-config: unknown opentelemetry setting '{key}' "
                    "(url, resource, bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)"
                )
        if "TENSORS" in levels and mode == "opentelemetry":
            raise ValueError("--trace-config level=TENSORS: the opentelemetry mode traces TIMESTAMPS only")
        setting = TraceSetting(level=frozenset(levels), **values)
        if setting.level and mode == "triton" and not setting.file:
            raise ValueError("--trace-config: tracing in triton mode needs a file (--trace-config triton,file=<path>)")
        return cls(mode, setting, OtelSettings(**otel, resource=tuple(resource)))


def _levels(values: Iterable[str], what: str) -> set[str]:
    out: set[str] = set()
    for v in values:
        v = v.strip().upper()
        if v == "OFF":
            continue
        if v not in LEVELS:
            raise ValueError(f"{what}: '{v}' is not OFF, TIMESTAMPS or TENSORS")
        out.add(v)
    return out


def _int(value: str, what: str, *, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{what}: '{value}' is not an integer") from None
    if n < minimum or n > 2**31 - 1:
        raise ValueError(f"{what}: {n} is out of range ({minimum} to {2**31 - 1})")
    return n


def setting_document(s: TraceSetting, mode: str) -> dict[str, Any]:
    """The extension's settings document (every value a string, the level a list)."""
    return {
        "trace_level": sorted(s.level) or ["OFF"],
        "trace_rate": str(s.rate),
        "trace_count": str(s.count),
        "log_frequency": str(s.log_frequency),
        "trace_file": s.file,
        "trace_mode": mode,
    }


def parse_update(doc: Mapping[str, Any], *, mode: str) -> dict[str, Any]:
    """A settings update (the extension's POST body, or gRPC's map): TraceSetting field ->
    new value, or None to clear it (a model's falls back to the global one; the global one to
    the startup value). InferenceError (INVALID_ARG) for anything else."""
    update: dict[str, Any] = {}
    for key, raw in doc.items():
        if key not in SETTING_FIELDS:
            raise _bad(f"unknown trace setting '{key}' (known: {', '.join(SETTING_FIELDS)})")
        name = SETTING_FIELDS[key]
        if raw is None or raw == []:
            update[name] = None
            continue
        if key == "trace_file":
            # where the server writes is the operator's choice, never a client's (Triton too refuses it)
            raise _bad("trace_file cannot be changed through the trace extension; use --trace-config triton,file=")
        if key == "trace_level":
            values = raw if isinstance(raw, list) else [raw]
            if not all(isinstance(v, str) for v in values):
                raise _bad("trace_level must be a list of strings")
            try:
                level = _levels(values, "trace_level")
            except ValueError as e:
                raise _bad(str(e)) from None
            if "TENSORS" in level and mode == "opentelemetry":
                raise _bad("trace_level TENSORS: the opentelemetry mode traces TIMESTAMPS only")
            update[name] = frozenset(level)
            continue
        if isinstance(raw, list) and len(raw) == 1:
            raw = raw[0]
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise _bad(f"{key} must be a string holding an integer")
        try:
            update[name] = _int(str(raw), key, minimum=-1 if key == "trace_count" else 0)
        except ValueError as e:
            raise _bad(str(e)) from None
        if key == "trace_rate" and update[name] == 0:
            raise _bad("trace_rate must be at least 1")
    return update


def apply_update(base: TraceSetting, fields: Mapping[str, Any]) -> TraceSetting:
    """``base`` with the fields set (None values left out)."""
    return replace(base, **{k: v for k, v in fields.items() if v is not None})


def _bad(message: str) -> InferenceError:
    return InferenceError(Code.INVALID_ARG, message)
