"""The server the hostile traffic goes to, with live sequences stepping beside it.

`Harness` owns one `seqserve serve` process (started with `start_server`, default flags) on a
repository of the demo models plus a few test models. A case that kills or wedges the server
fails, and the next case gets a fresh server, so one hole does not hide the others. The live
sequences (`tests.support.live`) run on their own copies of the accumulator models
(`live_acc`, `live_acc_corrid`), so hostile traffic that legitimately fills the demo models'
sequence slots cannot slow them: what they measure is the server as a whole.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from tests.support.live import LIVE_GRPC_MODEL, LIVE_HTTP_MODEL, LiveSequences
from tests.support.models import copy_demo_models, copy_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, start_server
from tests.support.wire import GRPC_OPTIONS


def build_repo(root: Path) -> Path:
    """The demo models the corpus aims at (accumulator, accumulator_corrid, add_sub), their
    live copies, `identity` (every datatype, [-1], max_batch_size 0) and `echo_bytes` (BYTES,
    [-1], max_batch_size 8)."""
    repo = copy_demo_models(root / "models", "accumulator", "accumulator_corrid", "add_sub")
    for src, dst in (("accumulator", LIVE_HTTP_MODEL), ("accumulator_corrid", LIVE_GRPC_MODEL)):
        copy_model(repo, src, dst, source=DEMO_REPO)
    copy_model(repo, "identity")
    copy_model(repo, "echo_bytes")
    return repo


# ---------------------------------------------------------------------------- harness


def health_live(srv: ServerProcess, timeout: float = 2.0) -> str | None:
    """None if /v2/health/live answers 200 within `timeout`, else what happened."""
    try:
        with urllib.request.urlopen(srv.base_url + "/v2/health/live", timeout=timeout) as r:
            return None if r.status == 200 else f"/v2/health/live answered {r.status}"
    except Exception as e:
        return f"/v2/health/live failed: {type(e).__name__}: {e}"


def log_tail(srv: ServerProcess, n: int = 3000) -> str:
    try:
        return srv.log()[-n:]
    except OSError:
        return "<no log>"


class Harness:
    """One hostile-traffic server plus live sequences; restarted when a case breaks them."""

    def __init__(self, repo: Path, log_dir: Path) -> None:
        self.repo = repo
        self.log_dir = log_dir
        self.srv: ServerProcess | None = None
        self.live: LiveSequences | None = None
        self.generation = 0
        self._channel: grpc.Channel | None = None
        self.restarts: list[str] = []

    # lifecycle
    def start(self) -> None:
        self.srv = start_server(self.repo, log_dir=self.log_dir)
        self.generation += 1
        self._start_live()

    def _start_live(self) -> None:
        assert self.srv is not None
        self.live = LiveSequences(self.srv).start()
        problems = self.live.problems({f: 2 for f in self.live.steps}, timeout=30)
        assert not problems, f"live sequences do not run on a fresh server: {problems}\n{log_tail(self.srv)}"

    def _stop_live(self) -> list[str]:
        failures = self.live.stop() if self.live is not None else []
        self.live = None
        return failures

    def _kill(self) -> None:
        self._stop_live()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.srv is not None and self.srv.alive():
            self.srv.proc.kill()
            self.srv.proc.wait(10)
        self.srv = None

    def ensure(self) -> None:
        """Before a case: a live, answering server with healthy live sequences."""
        if self.srv is None:
            self.start()
            return
        why = None if self.srv.alive() else f"server exited with {self.srv.proc.returncode}"
        why = why or health_live(self.srv)
        if why:
            self.restarts.append(why)
            self._kill()
            self.start()
            return
        assert self.live is not None
        if self.live.failures or not self.live.alive():
            self.restarts.append(f"live sequences restarted after: {self.live.failures}")
            self._stop_live()
            self._start_live()

    def close(self) -> int:
        """Stop the live sequences (their failures were reported by the cases) and the server;
        returns the server's exit code."""
        self._stop_live()
        if self._channel is not None:
            self._channel.close()
        return self.srv.stop() if self.srv is not None else 0

    # access
    @property
    def server(self) -> ServerProcess:
        assert self.srv is not None
        return self.srv

    @property
    def port(self) -> int:
        return self.server.http_port

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.server.grpc_url, options=GRPC_OPTIONS)
        return self._channel

    # checks
    def problems(self, since: dict[str, int], timeout: float = 5.0) -> list[str]:
        """After a case: the server is up and answers, the live sequences stepped on with correct
        sums. Returns what is wrong (empty: fine)."""
        srv = self.server
        if not srv.alive():
            return [f"the server died (exit {srv.proc.returncode}); log tail:\n{log_tail(srv)}"]
        out = []
        why = health_live(srv)
        if why:
            out.append(why)
        assert self.live is not None
        out += self.live.problems(since, timeout)
        if out:
            out.append(f"server log tail:\n{log_tail(srv)}")
        return out

    def run_case(self, what: str, body: Callable[[], Any]) -> Any:
        """Run one hostile case and check the server and the live sequences after it; every
        problem is reported together, the case's own first."""
        self.ensure()
        assert self.live is not None
        since = self.live.snapshot()
        err: BaseException | None = None
        result = None
        try:
            result = body()
        except AssertionError as e:
            err = e
        problems = self.problems(since)
        if err is not None or problems:
            lines = [f"case {what}:"]
            if err is not None:
                lines.append(str(err))
            lines += problems
            raise AssertionError("\n".join(lines)) from err
        return result


def release_sequence(port: int, model: str, sid: int | str) -> None:
    """Best effort: END a sequence a case may have left open (frees its slot)."""
    doc = {
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}],
        "parameters": {"sequence_id": sid, "sequence_end": True},
    }
    with contextlib.suppress(Exception):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("POST", f"/v2/models/{model}/infer", body=json.dumps(doc).encode())
        c.getresponse().read()
        c.close()
