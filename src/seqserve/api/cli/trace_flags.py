"""The "tracing" flags: Triton's ``--trace-config [<mode>,]<setting>=<value>`` (repeated) and its
deprecated single-setting forms (docs/observability.md, "Traces")."""

from __future__ import annotations

import argparse

from seqserve.api.tracing.settings import TraceConfig

#: Triton's deprecated flags, each one --trace-config setting
_DEPRECATED = {
    "--trace-file": "triton,file",
    "--trace-level": "level",
    "--trace-rate": "rate",
    "--trace-count": "count",
    "--trace-log-frequency": "triton,log-frequency",
}


def add_trace_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("tracing", "per-request traces, as Triton's (docs/observability.md)")
    g.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings, repeated: level=OFF|TIMESTAMPS|TENSORS (repeat for both), rate=N "
        "(every N-th request, default 1000), count=N (traces to collect, default -1: no end), "
        "mode=triton|opentelemetry; triton,file=PATH and triton,log-frequency=N (write every N traces to "
        "PATH.<k>; 0: at exit); opentelemetry,url=URL (OTLP/HTTP, default http://localhost:4318/v1/traces), "
        "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size|bsp_schedule_delay|"
        "bsp_max_export_batch_size=N (default: tracing off)",
    )
    for flag, setting in _DEPRECATED.items():
        g.add_argument(
            flag,
            dest="trace_config",
            action=_Deprecated,
            setting=setting,
            metavar="VALUE",
            help=f"deprecated in Triton: --trace-config {setting}=VALUE",
        )


class _Deprecated(argparse.Action):
    """A deprecated Triton trace flag, kept as the --trace-config setting it stands for."""

    def __init__(self, option_strings: list[str], dest: str, setting: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]
        self.setting = setting

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None
    ) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        items.append(f"{self.setting}={values}")
        setattr(namespace, self.dest, items)


def trace_config(args: argparse.Namespace) -> TraceConfig:
    """The flags as a TraceConfig; ValueError names the setting at fault and the accepted form."""
    return TraceConfig.parse(args.trace_config)
