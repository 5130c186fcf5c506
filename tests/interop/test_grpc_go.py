"""grpc-go (Go's gRPC, its own HTTP/2 and HPACK) against the builtin gRPC server, through the
client in tests/interop/go/seqclient. It is built offline from Debian's packages in GOPATH mode
(no module download): protoc with protoc-gen-go and protoc-gen-go-grpc generates the package
seqserve/inference from protos/ into a temporary GOPATH, beside /usr/share/gocode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.process import ServerProcess
from tests.support.tools import require_paths, require_programs

GO_PACKAGES = (
    "golang-go golang-google-grpc-dev golang-goprotobuf-dev golang-google-protobuf-dev "
    "golang-golang-x-net-dev protoc-gen-go-grpc protobuf-compiler"
)
DEBIAN_GOCODE = Path("/usr/share/gocode")
CLIENT_SOURCE = ROOT / "tests" / "interop" / "go" / "seqclient"
PROTOS = ROOT / "protos"
GENERATED_PACKAGE = "seqserve/inference"
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 60


def go_environment(gopath: Path) -> dict[str, str]:
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:{DEBIAN_GOCODE}", "GOFLAGS": ""}
    # go keeps its build cache under the user's cache directory; without a home, a temporary one
    if "GOCACHE" not in env and not os.environ.get("HOME"):
        env["GOCACHE"] = str(gopath / "cache")
    return env


def run_checked(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert run.returncode == 0, f"{' '.join(cmd)}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"


def build_client(workdir: Path) -> Path:
    """The seqclient binary: Go code generated from protos/, then `go build` in GOPATH mode."""
    gopath = workdir / "gopath"
    generated = gopath / "src" / GENERATED_PACKAGE
    generated.mkdir(parents=True)
    env = go_environment(gopath)
    protos = sorted(p.name for p in PROTOS.glob("*.proto") if p.name != "health.proto")
    # the protos name no go_package: map each file to the one Go package
    mapping = ",".join(f"M{name}={GENERATED_PACKAGE}" for name in protos)
    run_checked(
        [
            "protoc",
            f"-I{PROTOS}",
            f"--go_out={mapping},paths=source_relative:{generated}",
            f"--go-grpc_out={mapping},paths=source_relative:{generated}",
            *protos,
        ],
        env,
    )
    shutil.copytree(CLIENT_SOURCE, gopath / "src" / "seqclient")
    binary = workdir / "seqclient"
    run_checked(["go", "build", "-o", str(binary), "seqclient"], env, cwd=gopath)
    return binary


def require_go_toolchain() -> None:
    install = f"apt-get install {GO_PACKAGES}"
    require_programs("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc", install=install)
    sources = DEBIAN_GOCODE / "src"
    grpc_go, golang_protobuf = sources / "google.golang.org" / "grpc", sources / "github.com" / "golang" / "protobuf"
    require_paths(grpc_go, golang_protobuf, install=install)


@pytest.fixture(scope="session")
def seqclient(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grpc-go client, built once per session."""
    require_go_toolchain()
    return build_client(tmp_path_factory.mktemp("grpc-go"))


def run_client(client: Path, srv: ServerProcess, *args: str) -> tuple[int, dict[str, Any], str]:
    """seqclient's exit status, its JSON report and its stderr."""
    run = subprocess.run(
        [str(client), "-addr", srv.grpc_url, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    report = json.loads(run.stdout) if run.returncode == 0 else {}
    return run.returncode, report, run.stderr


def test_health_and_server_metadata(seqclient: Path, interop: ServerProcess) -> None:
    rc, report, err = run_client(seqclient, interop, "health")
    assert rc == 0, err
    assert report["live"] is True and report["ready"] is True
    assert report["name"] == "seqserve"


def test_sequences_unary_and_streamed(seqclient: Path, interop: ServerProcess) -> None:
    """A sequence over ModelInfer and one over ModelStreamInfer side by side, 20 steps each:
    seqclient checks the running sum after every step and a clean end of the stream."""
    rc, report, err = run_client(seqclient, interop, "sequence", "-model", "accumulator", "-steps", "20")
    assert rc == 0, err
    assert report == {"steps": 20, "unary_sum": 210, "stream_sum": 420}


@pytest.mark.parametrize(
    "entries",
    [
        100,
        pytest.param(130, marks=pytest.mark.xfail(strict=True, reason="fixed on s25h2: row 2")),
    ],
)
def test_many_metadata_entries(seqclient: Path, interop: ServerProcess, entries: int) -> None:
    """A call with `entries` metadata entries (about 30 bytes each, far under the advertised
    header list size) is served, and a stream already open on the same connection lives on."""
    rc, report, err = run_client(seqclient, interop, "metadata", "-entries", str(entries))
    assert rc == 0, err
    assert report["code"] == "OK", report
    assert report["stream_survived"] is True
