"""Triton command lines, taken from Triton's own documentation and deployment files
(triton-inference-server/server at 2.73.0: docs/user_guide, docs/customization_guide,
docs/protocol, deploy/), run through `seqserve serve` up to the point where it would serve:
none is refused, each flag means what it means to Triton (milliseconds converted), a flag
that does not apply earns exactly one warning line, and no flag of seqserve's may be
abbreviated."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import Any

import pytest

from seqserve.api import cli, security
from seqserve.api.cli import build_parser
from seqserve.api.logs import LogSettings
from seqserve.api.serve_options import ServeOptions

# (source in Triton's tree, the command line after `tritonserver`); {repo} is a directory
TRITON_COMMAND_LINES: list[tuple[str, str]] = [
    ("docs/user_guide/model_repository.md", "--model-repository={repo}"),
    ("docs/user_guide/metrics.md", "--model-repository={repo} --allow-metrics=false"),
    ("docs/user_guide/metrics.md", "--model-repository={repo} --allow-gpu-metrics=false --allow-cpu-metrics=false"),
    ("docs/user_guide/model_configuration.md", "--model-repository={repo} --model-config-name=h100"),
    (
        "docs/user_guide/model_configuration.md",
        "--model-repository={repo} --backend-config=default-max-batch-size=8",
    ),
    (
        "docs/user_guide/jetson.md",
        "--model-repository={repo} --backend-directory={repo} --backend-config=onnx,version=2",
    ),
    (
        "deploy/k8s-onprem/templates/deployment.yaml",
        "--model-store={repo} --model-control-mode=poll --repository-poll-secs=5",
    ),
    (
        "deploy/gcp/templates/deployment.yaml",
        "--model-store={repo} --strict-model-config=false --log-verbose=0 --allow-gpu-metrics=false",
    ),
    ("deploy/alibaba-cloud/README.md", "--model-repository={repo} --allow-grpc=true --allow-http=true"),
    (
        "docs/customization_guide/inference_protocols.md",
        "--model-repository={repo} --grpc-restricted-protocol=shared-memory,model-config,model-repository,statistics,"
        "trace:admin-key=admin-value --http-restricted-api=shared-memory,model-config,model-repository,statistics,"
        "trace:admin-key=admin-value",
    ),
    (
        "docs/customization_guide/inference_protocols.md",
        "--model-repository={repo} --grpc-keepalive-time=7200000 --grpc-keepalive-timeout=20000 "
        "--grpc-keepalive-permit-without-calls=0 --grpc-http2-max-pings-without-data=2 "
        "--grpc-http2-min-recv-ping-interval-without-data=300000 --grpc-http2-max-ping-strikes=2",
    ),
    (
        "docs/customization_guide/inference_protocols.md",
        "--model-repository={repo} --grpc-use-ssl=true --grpc-server-cert=cert.pem --grpc-server-key=key.pem",
    ),
    (
        "docs/customization_guide/inference_protocols.md",
        "--model-repository={repo} --grpc-use-ssl-mutual=true --grpc-server-cert=cert.pem "
        "--grpc-server-key=key.pem --grpc-root-cert=ca.pem",
    ),
    (
        "docs/protocol/extension_parameters.md",
        "--model-repository={repo} --http-header-forward-pattern PREFIX_.* --grpc-header-forward-pattern PREFIX_.*",
    ),
    ("docs/protocol/extension_parameters.md", "--model-repository={repo} --http-header-forward-pattern (?-i)PREFIX_.*"),
    (
        "docs/user_guide/optimization.md",
        "--model-repository={repo} --host-policy=gpu_0,numa-node=0 --host-policy=gpu_0,cpu-cores=0-15",
    ),
    ("docs/user_guide/response_cache.md", "--model-repository={repo} --cache-config local,size=1048576"),
    (
        "docs/user_guide/rate_limiter.md",
        "--model-repository={repo} --rate-limit=execution_count --rate-limit-resource=R1:10",
    ),
    ("docs/user_guide/performance_tuning.md", "--model-repository={repo} --log-verbose=1"),
    (
        "src/command_line_parser.cc (logging)",
        "--model-repository={repo} --log-format=ISO8601 --log-info=true "
        "--log-warning=true --log-error=true --log-file={repo}/triton.log",
    ),
    (
        "src/command_line_parser.cc (GPU/threads on CPU)",
        "--model-repository={repo} --http-thread-count=8 "
        "--grpc-infer-allocation-pool-size=8 --pinned-memory-pool-byte-size=268435456 "
        "--cuda-memory-pool-byte-size=0:67108864 --min-supported-compute-capability=6.0 "
        "--buffer-manager-thread-count=0 "
        "--model-load-gpu-limit 0:0.8 --enable-peer-access=false --exit-timeout-secs=30 --exit-on-error=true "
        "--strict-readiness=true --disable-auto-complete-config --id=triton-7 --model-load-thread-count=4",
    ),
    (
        "src/command_line_parser.cc (ports)",
        "--model-repository={repo} --http-port=8000 --grpc-port=8001 "
        "--metrics-port=8002 --reuse-http-port=true --reuse-grpc-port=true --http-max-input-size=67108864 "
        "--grpc-max-connection-age=60000 --grpc-max-connection-age-grace=5000",
    ),
    (
        "docs/user_guide/trace.md",
        "--model-repository={repo} --trace-config triton,file=/tmp/trace.json --trace-config triton,log-frequency=50 "
        "--trace-config rate=100 --trace-config level=TIMESTAMPS --trace-config count=100",
    ),
    (
        "docs/user_guide/trace.md (OpenTelemetry)",
        "--model-repository={repo} --trace-config mode=opentelemetry "
        "--trace-config opentelemetry,url=localhost:4318/v1/traces --trace-config rate=1",
    ),
    (
        "docs/user_guide/metrics.md (summaries)",
        "--model-repository={repo} --metrics-config summary_latencies=true "
        "--metrics-config summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001",
    ),
]


def _run(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, ServeOptions | None, list[str], Any]:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    argv = ["serve", *shlex.split(line.replace("{repo}", str(repo)))]
    started: list[ServeOptions] = []
    settings: list[LogSettings] = []
    monkeypatch.setattr(cli, "run", lambda opts: started.append(opts) or 0)
    monkeypatch.setattr(cli.log_control, "configure", lambda s: settings.append(s))
    monkeypatch.setattr(security, "check_tls", lambda what, tls: None)
    lines: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    handler = Recorder()
    logging.getLogger("seqserve").addHandler(handler)
    try:
        code = cli.main(argv)
    finally:
        logging.getLogger("seqserve").removeHandler(handler)
    return code, started[0] if started else None, lines, settings[0] if settings else None


@pytest.mark.parametrize(
    ("source", "line"), TRITON_COMMAND_LINES, ids=[f"{i}" for i in range(len(TRITON_COMMAND_LINES))]
)
def test_triton_command_line_starts(source: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, opts, warnings, _ = _run(line, tmp_path, monkeypatch)
    assert code == 0 and opts is not None, (source, line)
    assert len(warnings) == len(set(warnings)), warnings  # one line per flag


def test_keepalive_milliseconds_are_converted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, opts, _, _ = _run(TRITON_COMMAND_LINES[10][1], tmp_path, monkeypatch)
    assert opts is not None and opts.grpc is not None
    assert opts.grpc.limits.keepalive_s == 7200.0  # 2 hours, not 83 days
    assert opts.grpc.limits.keepalive_timeout_s == 20.0  # 20 s, not 20000 s


def test_triton_tls_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, opts, _, _ = _run(TRITON_COMMAND_LINES[11][1], tmp_path, monkeypatch)
    assert opts is not None and opts.grpc is not None and opts.grpc.tls is not None
    assert (opts.grpc.tls.cert, opts.grpc.tls.key, opts.grpc.tls.client_ca) == ("cert.pem", "key.pem", None)
    _, opts, _, _ = _run(TRITON_COMMAND_LINES[12][1], tmp_path, monkeypatch)
    assert opts is not None and opts.grpc is not None and opts.grpc.tls is not None
    assert opts.grpc.tls.client_ca == "ca.pem"
    assert opts.http is not None and opts.http.tls is None  # Triton's TLS flags are gRPC's only


def test_front_ends_and_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, opts, _, _ = _run("--model-store={repo} --allow-http=false --id=edge-7", tmp_path, monkeypatch)
    assert opts is not None and opts.http is None and opts.grpc is not None
    assert opts.engine.server_id == "edge-7"
    assert opts.engine.model_repository == [tmp_path / "repo"]
    _, opts, _, _ = _run(dict(TRITON_COMMAND_LINES)["src/command_line_parser.cc (ports)"], tmp_path, monkeypatch)
    assert opts is not None and opts.http is not None and opts.grpc is not None
    assert opts.http.reuse_port and opts.grpc.reuse_port
    assert opts.http.max_body_bytes == 67108864


def test_logging_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, settings = _run(TRITON_COMMAND_LINES[19][1], tmp_path, monkeypatch)
    assert settings == LogSettings(format="ISO8601", file=str(tmp_path / "repo" / "triton.log"))
    _, _, _, settings = _run("--log-verbose=2 --log-info=false --log-format=json", tmp_path, monkeypatch)
    assert settings == LogSettings(verbose=2, info=False, format="json")


def test_flags_that_do_not_apply_warn_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, warnings, _ = _run(TRITON_COMMAND_LINES[20][1], tmp_path, monkeypatch)
    assert code == 0
    ignored = [w for w in warnings if "ignored" in w]
    flagged = {w.split()[1].split("=")[0] for w in ignored}
    assert flagged == {
        "--http-thread-count",
        "--grpc-infer-allocation-pool-size",
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--min-supported-compute-capability",
        "--buffer-manager-thread-count",
        "--model-load-gpu-limit",
    }
    assert all(w.startswith("WARNING ") for w in ignored)


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def test_no_flag_may_be_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    """Every proper prefix of every flag that is not itself a flag is refused, for the command
    and its subcommand: a prefix never silently means a longer flag."""
    top = build_parser()
    sub_action = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub_action.choices["serve"]
    flags = _long_options(serve)
    assert "--grpc-keepalive-timeout-secs" in flags and "--grpc-keepalive-time" in flags
    prefixes = {f[:n] for f in flags for n in range(3, len(f))} - flags
    for prefix in sorted(prefixes):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["serve", f"{prefix}=1"])
        assert exit_info.value.code == 2, prefix
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and prefix in err, err
    for prefix in ("--vers", "--ver"):
        with pytest.raises(SystemExit) as exit_info:
            top.parse_args([prefix])
        assert exit_info.value.code == 2
    capsys.readouterr()


def test_refusals_are_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--http-port", "abc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "seqserve: --http-port: abc is not a TCP port (1-65535) or 'off' (see 'seqserve serve --help')\n"
    assert "_port" not in err and "usage" not in err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([flag])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("seqserve ")
