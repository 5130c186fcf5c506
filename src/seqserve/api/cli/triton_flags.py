"""tritonserver's flags under their own names, so that a Triton command line runs unchanged
(docs/cli.md, "Triton's flags"):

- a flag with a seqserve equivalent in another unit (Triton's milliseconds) is converted:
  ``triton_milliseconds`` gives it the seqserve flag's ``dest``, so that the later of the
  two on a command line wins, as with one flag given twice;
- Triton's TLS and ``--allow-http/--allow-grpc`` spellings are resolved into seqserve's
  settings by ``apply_triton_names``;
- a flag that does not apply to seqserve (C++ thread pools, GPU memory on this CPU build, a
  front-end seqserve does not have) is accepted and logged once as a warning (``ignored``),
  never refused: Triton accepts them on any machine.

Other flag modules register Triton names the same way: an alias in the option strings when
unit and meaning are the same, ``triton_milliseconds`` for a unit change, ``ignored`` for a
flag that does not apply.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from seqserve.api.cli.values import boolean, milliseconds_as_seconds

#: namespace attribute that collects the warnings of accepted-but-ignored flags
IGNORED_DEST = "ignored_flags"


def _always(_: str | None) -> bool:
    return True


def _unless_false(value: str | None) -> bool:
    """Warn unless the value turns the feature off (a Triton boolean)."""
    return value is None or _as_bool(value, default=True)


def _unless_zero(value: str | None) -> bool:
    return value is not None and value.strip() not in ("0", "")


def _unless_off(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("off", "none", "")


def _as_bool(value: str, *, default: bool) -> bool:
    try:
        return boolean(value)
    except argparse.ArgumentTypeError:
        return default


class IgnoredFlag(argparse.Action):
    """A Triton flag with no effect in seqserve: its value is kept only for the one warning
    line it earns (when ``warns(value)``), logged by ``log_ignored`` once logging is set up."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        reason: str = "",
        warns: Callable[[str | None], bool] = _always,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("nargs", "?")
        kwargs.setdefault("metavar", "VALUE")
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.reason = reason
        self.warns = warns

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        text = None if values is None else str(values)
        if not self.warns(text):
            return
        notes: list[str] = getattr(namespace, IGNORED_DEST, None) or []
        shown = option if text is None else f"{option}={text}"
        line = f"{shown} is accepted for Triton compatibility and ignored: {self.reason}"
        if line not in notes:
            notes.append(line)
        setattr(namespace, IGNORED_DEST, notes)


def ignored(
    add: Callable[..., argparse.Action], name: str, reason: str, warns: Callable[[str | None], bool] = _always
) -> None:
    """Accept Triton's ``name`` with one warning line (see IgnoredFlag)."""
    # not in --help: docs/cli.md lists them ("Triton's flags"), each with its reason
    add(name, action=IgnoredFlag, reason=reason, warns=warns, help=argparse.SUPPRESS)


def triton_milliseconds(add: Callable[..., argparse.Action], name: str, dest: str, seqserve_flag: str) -> None:
    """Triton's ``name`` in milliseconds, stored in seconds as seqserve's ``seqserve_flag``."""
    add(
        name,
        dest=dest,
        type=milliseconds_as_seconds,
        default=argparse.SUPPRESS,
        metavar="MS",
        help=f"Triton's name for {seqserve_flag}, in milliseconds",
    )


def bool_flag(add: Callable[..., argparse.Action], name: str, default: bool, help: str) -> None:
    """A Triton boolean: ``--flag``, ``--flag=true|false|1|0|on|off``."""
    add(name, type=boolean, nargs="?", const=True, default=default, metavar="BOOL", help=help)


_THREADS = "seqserve serves every connection on one event loop; it has no thread pool to size"
_GPU = "seqserve allocates device memory per GPU instance through CUDA's stream-ordered pool (docs/gpu.md)"
_PINGS = "the builtin gRPC server counts no client PING against the client (more permissive than Triton)"
_NO_CACHE = "seqserve has no response cache"


def add_triton_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group(
        "Triton's names",
        "tritonserver's flags, accepted as Triton reads them (docs/cli.md, \"Triton's flags\")",
    )
    add = g.add_argument
    triton_milliseconds(add, "--grpc-keepalive-time", "grpc_keepalive_secs", "--grpc-keepalive-secs")
    triton_milliseconds(add, "--grpc-keepalive-timeout", "grpc_keepalive_timeout_secs", "--grpc-keepalive-timeout-secs")
    bool_flag(add, "--allow-http", True, "serve HTTP (default: true); false is --http-port off")
    bool_flag(add, "--allow-grpc", True, "serve gRPC (default: true); false is --grpc-port off")
    bool_flag(add, "--grpc-use-ssl", False, "gRPC over TLS with --grpc-server-cert and --grpc-server-key")
    bool_flag(add, "--grpc-use-ssl-mutual", False, "gRPC over mutual TLS: clients' certificates from --grpc-root-cert")
    add("--grpc-server-cert", metavar="PEM", help="Triton's name for --grpc-tls-cert (needs --grpc-use-ssl)")
    add("--grpc-server-key", metavar="PEM", help="Triton's name for --grpc-tls-key (needs --grpc-use-ssl)")
    add("--grpc-root-cert", metavar="PEM", help="Triton's name for --grpc-tls-client-ca (needs --grpc-use-ssl-mutual)")
    add(
        "--disable-auto-complete-config",
        action="store_true",
        help="backends do not complete configs from the model file (ONNX inputs, outputs, max_batch_size)",
    )
    add(
        "--strict-model-config",
        type=boolean,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="Triton's deprecated name: true is --disable-auto-complete-config",
    )
    _add_ignored(add)


def _add_ignored(add: Callable[..., argparse.Action]) -> None:
    for name in (
        "--http-thread-count",
        "--grpc-infer-thread-count",
        "--grpc-infer-allocation-pool-size",
        "--grpc-max-response-pool-size",
        "--buffer-manager-thread-count",
    ):
        ignored(add, name, _THREADS)
    for name in (
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--cuda-virtual-address-size",
        "--min-supported-compute-capability",
        "--model-load-gpu-limit",
    ):
        ignored(add, name, _GPU)
    ignored(add, "--enable-peer-access", _GPU, _unless_false)
    bool_flag(add, "--allow-gpu-metrics", True, "serve Triton's GPU metrics where there is a GPU (default: true)")
    ignored(add, "--model-load-retry-count", "a model that fails to load is not retried", _unless_zero)
    ignored(add, "--model-namespacing", "a model name must be unique across the repositories", _unless_false)
    ignored(add, "--grpc-infer-response-compression-level", "gRPC responses are not compressed", _unless_off)
    ignored(add, "--grpc-keepalive-permit-without-calls", _PINGS)
    ignored(add, "--grpc-http2-max-pings-without-data", _PINGS)
    ignored(add, "--grpc-http2-min-recv-ping-interval-without-data", _PINGS)
    ignored(add, "--grpc-http2-max-ping-strikes", _PINGS)
    ignored(add, "--rate-limit", "seqserve has no rate limiter", _unless_off)
    ignored(add, "--rate-limit-resource", "seqserve has no rate limiter")
    ignored(add, "--host-policy", "seqserve does not pin models to NUMA nodes or cores")
    ignored(add, "--cache-config", _NO_CACHE)
    ignored(add, "--cache-directory", _NO_CACHE)
    ignored(add, "--response-cache-byte-size", _NO_CACHE, _unless_zero)
    ignored(add, "--repoagent-directory", "seqserve has no repository agents")
    for name in ("--allow-sagemaker", "--allow-vertex-ai"):
        ignored(add, name, "seqserve has no SageMaker or Vertex AI front-end", _unless_false)
    for name in (
        "--sagemaker-port",
        "--sagemaker-safe-port-range",
        "--sagemaker-thread-count",
        "--vertex-ai-port",
        "--vertex-ai-thread-count",
        "--vertex-ai-default-model",
    ):
        ignored(add, name, "seqserve has no SageMaker or Vertex AI front-end")


def apply_triton_names(args: argparse.Namespace) -> None:
    """Resolve Triton's spellings into seqserve's settings on ``args`` (before the checks):
    ``--allow-http/--allow-grpc=false`` turn the front-end off; the gRPC TLS files apply with
    ``--grpc-use-ssl`` (or ``-mutual``) only, as in Triton, and otherwise earn a warning."""
    if not args.allow_http:
        args.http_port = None
    if not args.allow_grpc:
        args.grpc_port = None
    triton_files = {
        "--grpc-server-cert": args.grpc_server_cert,
        "--grpc-server-key": args.grpc_server_key,
        "--grpc-root-cert": args.grpc_root_cert,
    }
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        args.grpc_tls_cert = args.grpc_tls_cert or args.grpc_server_cert
        args.grpc_tls_key = args.grpc_tls_key or args.grpc_server_key
        if args.grpc_use_ssl_mutual:
            args.grpc_tls_client_ca = args.grpc_tls_client_ca or args.grpc_root_cert
        elif args.grpc_root_cert:
            _note(args, "--grpc-root-cert is ignored without --grpc-use-ssl-mutual=true (as in Triton)")
        return
    for flag, value in triton_files.items():
        if value:
            _note(args, f"{flag} is ignored without --grpc-use-ssl=true (as in Triton)")


def _note(args: argparse.Namespace, line: str) -> None:
    notes: list[str] = getattr(args, IGNORED_DEST, None) or []
    notes.append(line)
    setattr(args, IGNORED_DEST, notes)
