"""The `seqserve` command line, pinned: what a set of command lines print and parse to (the
options `serve` runs with, or the exit code and message that refuse them; the help pages at
COLUMNS=100) is the snapshot in tests/data/cli/serve_snapshot.json, taken before the CLI was
reshaped. Rewrite it (SEQSERVE_WRITE_CLI_SNAPSHOT=1) only for a change meant to be seen."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from seqserve.api import cli, security
from seqserve.api.cli.arguments import serve_options
from seqserve.api.cli.parser import build_parser
from seqserve.api.logs import LogSettings
from seqserve.api.serve_options import ServeOptions
from seqserve.engine import DEFAULT_INLINE_MAX_BATCH_US, WORKERS_INLINE_MAX_BATCH_US

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "data" / "cli" / "serve_snapshot.json"

# "{repo}" and "{repo2}" are directories made for the test; "{nodir}" does not exist.
COMMAND_LINES: list[str] = [
    "",
    "--version",
    "--help",
    "serve --help",
    "serve",
    "serve --model-repository {repo}",
    (
        "serve --model-repository {repo} --model-repository {repo2} --exit-on-error false "
        "--strict-readiness off --model-control-mode EXPLICIT --load-model a --load-model b --host 127.0.0.1 "
        "--http-address ::1 --grpc-port off --log-verbose 2 --exit-timeout-secs 0 --strict-sequence-ids "
        "--max-backlog-sequences 0 --stream-scoped-sequences --http-server hypercorn --grpc-server grpcio "
        "--allow-metrics false --metrics-port 9000 --session-tombstone-secs 0 --session-tombstone-max 0 "
        "--python-isolation process --inline-max-batch-us 0 --tls-cert c.pem --tls-key k.pem "
        "--http-tls-client-ca ca.pem --http-restricted-api model-repository,statistics:admin=secret "
        "--http-restricted-api health:probe=yes --grpc-restricted-protocol inference:k=v "
        "--http-max-body-bytes 1024 --http-header-timeout-secs 2.5 --http-body-timeout-secs 3 "
        "--http-keepalive-secs 0 --http-max-connections 7 --state-store dir:///tmp/store --replica-id r1 "
        "--spill-idle-secs 4 --handover-timeout-secs 0.5"
    ),
    (
        "serve --model-repository {repo} --model-control-mode poll --repository-poll-secs inf --http-port "
        "off --grpc-port 9001 --grpc-address 127.0.0.2 --metrics-address :: --metrics-interval-ms 5 "
        "--metrics-config counter_latencies=false --metrics-config histogram_latencies=true "
        "--http-max-body-bytes 2048 --grpc-max-send-message-bytes 4096 --grpc-max-concurrent-streams 3 "
        "--grpc-max-connections 2 --grpc-max-connection-idle-secs 0 --grpc-keepalive-secs 1e-3 "
        "--grpc-keepalive-timeout-secs 9 --grpc-tls-cert gc.pem --grpc-tls-key gk.pem --tls-client-ca ca.pem "
        "--state-store redis://h:6379/0 --spill-idle-secs 0"
    ),
    "serve --model-repository {repo} --model-control-mode poll --repository-poll-secs 0",
    "serve --model-repository {repo} --model-control-mode explicit --load-model '*'",
    "serve --model-repository {repo} --http-port OFF --grpc-port none --metrics-port 1",
    "serve --model-repository {repo} --grpc-port -1 --grpc-max-receive-message-bytes 5",
    "serve --model-repository {repo} --repository-poll-secs 3",
    "serve --model-repository {repo} --exit-on-error --strict-readiness",
    "serve --model-repository {repo} --log-level debug --log-verbose 0",
    "serve --http-port off --grpc-port off",
    "serve --tls-cert c.pem",
    "serve --http-port off --grpc-tls-key k.pem",
    "serve --tls-client-ca ca.pem",
    "serve --http-port off --grpc-tls-client-ca ca.pem",
    "serve --grpc-port off --grpc-tls-client-ca ca.pem --model-repository {repo}",
    "serve --tls-cert bad.pem --tls-key k.pem",
    "serve --http-port off --grpc-tls-cert bad.pem --grpc-tls-key k.pem",
    "serve --tls-cert c.pem --tls-key k.pem --tls-client-ca ca.pem --http-server granian",
    "serve --http-restricted-api nothing:k=v",
    "serve --grpc-restricted-protocol inference:k-bin=v",
    "serve --http-restricted-api health",
    "serve --load-model a",
    "serve --model-control-mode explicit --load-model '*' --load-model a",
    "serve --metrics-config summary_latencies=true",
    "serve --metrics-config nothing",
    "serve --model-repository {nodir}",
    "serve --model-repository {repo} --spill-idle-secs 1",
    "serve --model-repository {nodir} --metrics-config x=y",
    "serve --tls-cert c.pem --http-restricted-api x:k=v",
    "serve --nothing",
    "serve --http-port 0",
    "serve --http-port 65536",
    "serve --grpc-port x",
    "serve --exit-on-error maybe",
    "serve --allow-metrics x",
    "serve --log-verbose -1",
    "serve --log-verbose x",
    "serve --log-level trace",
    "serve --metrics-port 0",
    "serve --metrics-port off",
    "serve --metrics-interval-ms 0",
    "serve --metrics-interval-ms 1.5",
    "serve --max-backlog-sequences -1",
    "serve --max-backlog-sequences x",
    "serve --session-tombstone-max -2",
    "serve --inline-max-batch-us -1",
    "serve --repository-poll-secs -1",
    "serve --repository-poll-secs nan",
    "serve --repository-poll-secs x",
    "serve --session-tombstone-secs -0.5",
    "serve --http-keepalive-secs -1",
    "serve --grpc-max-connection-idle-secs nan",
    "serve --http-max-body-bytes 0",
    "serve --http-max-body-bytes 2147483648",
    "serve --grpc-max-concurrent-streams x",
    "serve --http-header-timeout-secs 0",
    "serve --http-body-timeout-secs 1e9",
    "serve --grpc-keepalive-secs nan",
    "serve --grpc-keepalive-timeout-secs x",
    "serve --exit-timeout-secs -1",
    "serve --exit-timeout-secs inf",
    "serve --exit-timeout-secs x",
    "serve --spill-idle-secs x",
    "serve --spill-idle-secs -1",
    "serve --spill-idle-secs inf",
    "serve --spill-idle-secs nan",
    "serve --handover-timeout-secs 0",
    "serve --handover-timeout-secs -1",
    "serve --handover-timeout-secs inf",
    "serve --handover-timeout-secs x",
    "serve --state-store http://h",
    "serve --state-store store",
    "serve --model-control-mode manual",
    "serve --http-server uvicorn",
    "serve --grpc-server grpclib",
    "serve --python-isolation fork",
    # Triton's names and units (docs/cli.md, "Triton's flags")
    "-V",
    "serve --grpc-keepalive-time=7200000 --grpc-keepalive-timeout=20000 --model-repository {repo}",
    "serve --grpc-keepalive-tim=7200000",
    "serve --http-max=100",
    "serve --grpc-max-connection=5",
    "serve --http-port abc",
    "serve --model-store {repo} --allow-http=false --allow-grpc=true --http-max-input-size=4096 --id=edge-7",
    "serve --model-repository {repo} --allow-grpc=0 --allow-gpu-metrics=false --allow-cpu-metrics=true",
    (
        "serve --model-repository {repo} --grpc-use-ssl=true --grpc-server-cert gc.pem --grpc-server-key gk.pem "
        "--grpc-use-ssl-mutual=1 --grpc-root-cert ca.pem --http-port off"
    ),
    "serve --model-repository {repo} --grpc-server-cert gc.pem --grpc-server-key gk.pem",
    (
        "serve --model-repository {repo} --http-thread-count 16 --grpc-infer-allocation-pool-size=8 "
        "--pinned-memory-pool-byte-size=0 --cuda-memory-pool-byte-size 0:0 --allow-sagemaker=false "
        "--strict-model-config=false --disable-auto-complete-config --rate-limit=off --model-load-retry-count 0"
    ),
    (
        "serve --model-repository {repo} --log-verbose=1 --log-info=false --log-warning 0 --log-error=true "
        "--log-format=ISO8601 --log-file=/tmp/seqserve.log --log-tracebacks"
    ),
    "serve --model-repository {repo} --log-level warning --log-format JSON",
    "serve --log-format glog",
    "serve --log-info maybe",
    "serve --model-repository {repo} --reuse-http-port=true --reuse-grpc-port=1",
    (
        "serve --model-repository {repo} --backend-config=python,shm-default-byte-size=1048576 "
        "--backend-config=onnx,version=2 --backend-config=default-max-batch-size=8"
    ),
    "serve --backend-config=nothing",
    "serve --model-config-name 'h 100'",
    "serve --http-header-forward-pattern '('",
]
CASES = [shlex.split(line) for line in COMMAND_LINES]


def _fake_check_tls(what: str, tls: security.TlsFiles) -> None:
    """No certificate files here: a file named bad.pem is the one that does not load."""
    if "bad" in tls.cert:
        raise ValueError(f"{what} TLS: cannot load {tls.cert}")


def _plain(value: Any, names: dict[str, str]) -> Any:
    """A value as JSON: paths with the test's directories named, restrictions with their values."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (Path, str)):
        text = str(value)
        for path, name in sorted(names.items(), key=lambda item: -len(item[0])):
            text = text.replace(path, name)
        return text
    if isinstance(value, security.Restrictions):
        return {group: [r.header, r.value] for group, r in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), names) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, names) for v in value]
    return value


def flat(opts: ServeOptions) -> dict[str, Any]:
    """What `serve` will do, under the names of the first, flat ServeOptions (the snapshot was
    taken with it); a front-end that is off (and the metrics and state store when off) shows
    only that."""
    engine, http, grpc, metrics, store = opts.engine, opts.http, opts.grpc, opts.metrics, opts.state_store
    out: dict[str, Any] = {
        "model_repository": engine.model_repository,
        "exit_on_error": engine.exit_on_error,
        "strict_readiness": engine.strict_readiness,
        "model_control": engine.model_control,
        "startup_models": engine.startup_models,
        "repository_poll_secs": engine.repository_poll_secs,
        "exit_timeout_s": engine.exit_timeout_s,
        "strict_sequence_ids": engine.strict_sequence_ids,
        "max_backlog_sequences": engine.max_backlog_sequences,
        "session_tombstone_s": engine.sessions.tombstone_s,
        "session_tombstone_max": engine.sessions.tombstone_max,
        "python_isolation": engine.python_isolation,
        "inline_max_batch_us": engine.inline_max_batch_us,
        "server_id": engine.server_id,
        "model_config_name": engine.model_config_name,
        "auto_complete_config": engine.auto_complete_config,
        "default_max_batch_size": engine.default_max_batch_size,
        "http_port": None if http is None else http.port,
        "grpc_port": None if grpc is None else grpc.port,
        "metrics_port": None if metrics is None else metrics.port,
        "state_store": None if store is None else store.url,
    }
    if http is not None:
        out |= {
            "http_host": http.host,
            "http_server": http.server,
            "http_max_body_bytes": http.max_body_bytes,
            "http_limits": http.limits,
            "http_tls": None if http.tls is None else [http.tls.cert, http.tls.key, http.tls.client_ca],
            "http_restricted": http.restricted,
            "http_reuse_port": http.reuse_port,
        }
    if grpc is not None:
        out |= {
            "grpc_host": grpc.host,
            "grpc_server": grpc.server,
            "grpc_limits": grpc.limits,
            "grpc_tls": None if grpc.tls is None else [grpc.tls.cert, grpc.tls.key, grpc.tls.client_ca],
            "grpc_restricted": grpc.restricted,
            "stream_scoped_sequences": grpc.stream_scoped,
            "grpc_reuse_port": grpc.reuse_port,
        }
    if metrics is not None:
        out |= {
            "metrics_host": metrics.host,
            "metrics_interval_ms": metrics.interval_ms,
            "metrics_config": metrics.config,
        }
    if store is not None:
        out |= {
            "replica_id": store.replica_id,
            "spill_idle_s": store.spill_idle_s,
            "handover_timeout_s": store.handover_timeout_s,
        }
    return out


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def observe(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """Run `seqserve <argv>` up to the point where it would serve."""
    repos = {"{repo}": tmp_path / "repo", "{repo2}": tmp_path / "repo2", "{nodir}": tmp_path / "nodir"}
    for name in ("{repo}", "{repo2}"):
        repos[name].mkdir(exist_ok=True)
    args = [str(repos[a]) if a in repos else a for a in argv]
    started: list[Any] = []
    logging_to: list[LogSettings] = []
    monkeypatch.setattr(cli, "run", lambda opts: started.append(opts) or 0)
    monkeypatch.setattr(cli.log_control, "configure", lambda settings: logging_to.append(settings))
    monkeypatch.setattr(security, "check_tls", _fake_check_tls)
    monkeypatch.setattr(security, "granian_client_verify_supported", lambda: False)
    handler = _Recorder()
    # only the recorder hears the CLI's log: another test in this process may have left a
    # handler writing to stderr, or levels of its own (the snapshot is taken at WARNING)
    seq_log, root = logging.getLogger("seqserve"), logging.getLogger()
    saved = (seq_log.handlers[:], seq_log.propagate, seq_log.level, root.level)
    seq_log.handlers, seq_log.propagate = [handler], False
    seq_log.setLevel(logging.WARNING)
    try:
        code = cli.main(args)
    except SystemExit as e:
        code = e.code  # type: ignore[assignment]
    finally:
        seq_log.handlers, seq_log.propagate = saved[0], saved[1]
        seq_log.setLevel(saved[2])
        root.setLevel(saved[3])
    out = capsys.readouterr()
    names = {str(p): name for name, p in repos.items()}
    names[str(cli.DEMO_REPOSITORY)] = "{demo}"
    return {
        "argv": argv,
        "exit": code,
        "stdout": _plain(out.out, names),
        "stderr": _plain(out.err, names),
        "log": _plain(handler.lines, names),
        "options": _plain(flat(started[0]), names) if started else None,
        "logging": _plain(logging_to[0], names) if logging_to else None,
    }


def observed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    monkeypatch.setenv("COLUMNS", "100")
    return [observe(argv, tmp_path, monkeypatch, capsys) for argv in CASES]


def test_command_lines_parse_as_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    got = observed(tmp_path, monkeypatch, capsys)
    want = json.loads(SNAPSHOT.read_text())
    assert [case["argv"] for case in want] == CASES, "the snapshot is for other command lines"
    for g, w in zip(got, want, strict=True):
        assert g == w


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(opts: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run", interrupted)
    assert cli.main(["serve"]) == 130


@pytest.mark.skipif(not os.environ.get("SEQSERVE_WRITE_CLI_SNAPSHOT"), reason="writes the snapshot on request")
def test_write_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SEQSERVE_WRITE_CLI_SNAPSHOT=1: record what the command lines parse to now."""
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps(observed(tmp_path, monkeypatch, capsys), indent=1) + "\n")


@pytest.mark.parametrize(
    ("argv", "bound"),
    [
        ([], DEFAULT_INLINE_MAX_BATCH_US),
        (["--workers", "1"], DEFAULT_INLINE_MAX_BATCH_US),
        (["--workers", "2"], WORKERS_INLINE_MAX_BATCH_US),
        (["--workers", "2", "--inline-max-batch-us", "200"], 200),
        (["--inline-max-batch-us", "0"], 0),
    ],
)
def test_the_inline_bound_defaults_larger_under_worker_processes(argv: list[str], bound: int) -> None:
    # under --workers the batches run on the ring drain thread, not on a loop serving clients
    args = build_parser().parse_args(["serve", "--model-repository", str(ROOT / "bench" / "models"), *argv])
    assert serve_options(args).engine.inline_max_batch_us == bound
