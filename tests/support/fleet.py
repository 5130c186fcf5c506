"""Replicas sharing a state store as real processes that a test may kill (SIGKILL) or drain
(SIGTERM), raw accumulator steps that never raise, and `SumModel`: what each sequence's running
sum may be, so that a wrong sum (a silent fresh start, a lost or doubled step) is caught while
errors that say a sequence is lost are accepted."""

from __future__ import annotations

import http.client
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.models import copy_demo_models
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, start_server


@dataclass
class Reply:
    """One step's outcome: an HTTP status (0: no answer, the connection failed) and the sum or
    the error text."""

    status: int
    value: float | None = None
    error: str = ""

    @property
    def lost(self) -> bool:
        """An error that says the sequence is gone: 410 (a session), or Triton's START error /
        the "was lost" error for a plain sequence (400)."""
        return self.status in (400, 410)

    @property
    def refused(self) -> bool:
        """Refused before it reached the model (retry later): the step was not applied."""
        return self.status == 503


def step(
    srv: ServerProcess, x: float, *, session: str = "", sequence_id: int = 0, start: bool = False, end: bool = False
) -> Reply:
    """One accumulator step as raw JSON over a new connection: a session step (its START implied
    unless `start`) or a plain `sequence_id` step."""
    params: dict[str, object] = {}
    headers = {"Content-Type": "application/json"}
    if session:
        headers["Inference-Session-Id"] = session
    else:
        params["sequence_id"] = sequence_id
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [x]}],
        "parameters": params,
    }
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=20)
    try:
        conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body).encode(), headers)
        r = conn.getresponse()
        doc = json.loads(r.read() or b"null")
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Reply(0, error=f"{type(e).__name__}: {e}")
    finally:
        conn.close()
    if r.status == 200:
        return Reply(200, float(doc["outputs"][0]["data"][0]))
    return Reply(r.status, error=str(doc.get("error") if isinstance(doc, dict) else doc))


def patient_repo(root: Path) -> Path:
    """The demo accumulator with a 60 s idle timeout: a fault test's pauses (a frozen store, a
    replica's startup) must not expire its sessions."""
    repo = copy_demo_models(root, "accumulator")
    config = repo / "accumulator" / "config.pbtxt"
    text = config.read_text()
    idle = "max_sequence_idle_microseconds: "
    assert f"{idle}5000000" in text, text
    config.write_text(text.replace(f"{idle}5000000", f"{idle}60000000"))
    return repo


class Replica:
    """One `seqserve serve --state-store URL --replica-id NAME` process."""

    def __init__(self, store_url: str, name: str, log_dir: Path, *flags: str, repo: Path = DEMO_REPO) -> None:
        self.name = name
        self.srv = start_server(
            repo, "--state-store", store_url, "--replica-id", name, *flags, log_dir=log_dir, exit_timeout_s=5.0
        )

    def kill(self) -> None:
        """SIGKILL: its live sequences die with it."""
        if self.srv.alive():
            self.srv.proc.send_signal(signal.SIGKILL)
            self.srv.proc.wait(10)

    def drain(self) -> int:
        """SIGTERM: its sequences move to the store; the exit status."""
        return self.srv.stop()

    def log(self) -> str:
        return self.srv.log()


@dataclass
class SumModel:
    """A sequence as the client knows it: the sums it may hold (more than one after a step whose
    answer never came: applied or not), or dead (an error said it is lost)."""

    possible: set[float] = field(default_factory=lambda: {0.0})
    dead: bool = False
    started: bool = False

    def check(self, x: float, reply: Reply, *, start: bool = False) -> str:
        """Fold one step's reply in; a message when it is wrong (a sum no history explains)."""
        before = {0.0} if start else self.possible
        if reply.status == 200:
            assert reply.value is not None
            candidates = {round(s + x, 3) for s in before}
            if round(reply.value, 3) not in candidates:
                return f"step {x:g}: sum {reply.value:g}, expected one of {sorted(candidates)}"
            self.possible = {reply.value}
            self.started = True
        elif reply.lost:
            self.dead = True
        elif reply.status == 0:  # no answer: applied or not
            self.possible = before | {s + x for s in before}
        elif not reply.refused:
            return f"step {x:g}: unexpected {reply.status} {reply.error}"
        return ""
