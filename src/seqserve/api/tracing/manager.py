"""``TraceManager``: the trace settings of one server (global and per model), which requests
are sampled, and where their traces go. It is the engine's ``Server.tracer`` only while some
request can be traced or timed (a level other than OFF with traces left to collect, or the
latency summaries on); otherwise ``Server.tracer`` is None and a request pays one None check."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from seqserve.api.tracing.otel import OtelExporter
from seqserve.api.tracing.records import ObservedRequest, SampledTrace, TraceFile
from seqserve.api.tracing.settings import TraceConfig, TraceSetting, apply_update, parse_update, setting_document
from seqserve.engine import Code, InferenceError, Server
from seqserve.engine.tracing import RequestTrace, TracedRequest

log = logging.getLogger("seqserve.trace")

Observer = Callable[[RequestTrace], None]


class _Sampler:
    """Every ``rate``-th request of those a setting covers, while ``count`` lasts."""

    __slots__ = ("seen", "setting")

    def __init__(self, setting: TraceSetting) -> None:
        self.setting = setting
        self.seen = 0

    def take(self) -> bool:
        s = self.setting
        if not s.active:
            return False
        self.seen += 1
        if self.seen % s.rate:
            return False
        if s.count > 0:
            self.setting = replace(s, count=s.count - 1)
        return True


class TraceManager:
    """Trace settings and sampling for one server (Triton's trace extension)."""

    def __init__(self, server: Server, config: TraceConfig, *, observe: Observer | None = None) -> None:
        """``observe``: called with every answered request's timings (the latency summaries);
        None: only sampled requests are timed."""
        self.server = server
        self.mode = config.mode
        self._startup = config.setting
        self._global = _Sampler(config.setting)
        self._model_fields: dict[str, dict[str, Any]] = {}  # what was set for a model
        self._models: dict[str, _Sampler] = {}
        self._observe = observe
        self._files: dict[tuple[str, int], TraceFile] = {}
        self._otel = OtelExporter(config.otel) if config.mode == "opentelemetry" else None
        self._refresh()

    # ----------------------------------------------------------------- Server.tracer

    def sample(self, request: TracedRequest, model: str, version: str) -> RequestTrace | None:
        sampler = self._models.get(model, self._global)
        observe = self._observe or _ignore
        if sampler.take():
            tensors = "TENSORS" in sampler.setting.level
            if not sampler.setting.active:  # that was the last of its count
                self._refresh()
            return SampledTrace(request, model, version, observe, self._sink(sampler.setting), tensors=tensors)
        if self._observe is not None:
            return ObservedRequest(request, model, version, self._observe)
        return None

    def _sink(self, setting: TraceSetting) -> Callable[[SampledTrace], None]:
        if self._otel is not None:
            return self._otel.export
        key = (setting.file, setting.log_frequency)
        f = self._files.get(key)
        if f is None:
            f = self._files[key] = TraceFile(setting.file, setting.log_frequency)
        return f.add

    # ---------------------------------------------------------------- the extension

    def settings(self, model: str = "") -> dict[str, Any]:
        """The settings document of ``model`` ("": the global settings)."""
        if model:
            self._check_model(model)
        return setting_document(self._models.get(model, self._global).setting, self.mode)

    def update(self, model: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a settings update (see ``settings.parse_update``); returns the new settings."""
        if model:
            self._check_model(model)
        fields = parse_update(doc, mode=self.mode)
        if model:
            merged = {**self._model_fields.get(model, {}), **fields}
            merged = {k: v for k, v in merged.items() if v is not None}
            self._check(apply_update(self._global.setting, merged))
            if merged:
                self._model_fields[model] = merged
            else:
                self._model_fields.pop(model, None)
        else:
            cleared = {k: getattr(self._startup, k) for k, v in fields.items() if v is None}
            setting = apply_update(self._global.setting, {**fields, **cleared})
            self._check(setting)
            self._global = _Sampler(setting)
        self._models = {name: _Sampler(apply_update(self._global.setting, f)) for name, f in self._model_fields.items()}
        self._refresh()
        return self.settings(model)

    def _check(self, setting: TraceSetting) -> None:
        if setting.active and self.mode == "triton" and not setting.file:
            raise InferenceError(
                Code.INVALID_ARG, "tracing in triton mode needs a trace file (--trace-config triton,file=<path>)"
            )

    def _check_model(self, model: str) -> None:
        if not any(e["name"] == model for e in self.server.repository_index()):
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{model}' is not found")

    def _refresh(self) -> None:
        on = (
            self._observe is not None
            or self._global.setting.active
            or any(s.setting.active for s in self._models.values())
        )
        self.server.tracer = self if on else None

    def close(self) -> None:
        """At exit: write what the trace files still hold, flush the exporter."""
        self.server.tracer = None
        for f in self._files.values():
            f.close()
        if self._otel is not None:
            self._otel.close()


def _ignore(trace: RequestTrace) -> None:
    pass


_managers: weakref.WeakKeyDictionary[Server, TraceManager] = weakref.WeakKeyDictionary()


def install_tracing(server: Server, config: TraceConfig, *, observe: Observer | None = None) -> TraceManager:
    """The server's trace manager, from ``--trace-config`` (and the summaries' observer)."""
    manager = TraceManager(server, config, observe=observe)
    _managers[server] = manager
    if config.setting.active:
        where = config.otel.url if config.mode == "opentelemetry" else config.setting.file
        log.info(
            "tracing %s (%s) every %d request(s) to %s",
            "+".join(sorted(config.setting.level)),
            config.mode,
            config.setting.rate,
            where,
        )
    return manager


def trace_manager(server: Server) -> TraceManager:
    """The server's trace manager (one with tracing off if none was installed)."""
    manager = _managers.get(server)
    if manager is None:
        manager = _managers[server] = TraceManager(server, TraceConfig())
    return manager
