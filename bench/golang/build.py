"""Builds a Go program that talks to seqserve over gRPC, offline, from Debian's packages.

No module download: GOPATH mode over ``/usr/share/gocode`` (Debian's Go sources), with protoc,
protoc-gen-go and protoc-gen-go-grpc generating the package ``seqserve/inference`` from
``protos/`` into a temporary GOPATH. Used by the bench's load generator (``seqload``) and by the
grpc-go interop tests (``tests/interop``).

    python -m bench.golang.build OUT_DIR     # builds bench/golang/seqload into OUT_DIR/seqload
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
SEQLOAD_SOURCE = Path(__file__).resolve().parent / "seqload"
GO_PACKAGES = (
    "golang-go golang-google-grpc-dev golang-goprotobuf-dev golang-google-protobuf-dev "
    "golang-golang-x-net-dev protoc-gen-go-grpc protobuf-compiler"
)
INSTALL = f"apt-get install {GO_PACKAGES}"
DEBIAN_GOCODE = Path("/usr/share/gocode")
GENERATED_PACKAGE = "seqserve/inference"
PROGRAMS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
BUILD_TIMEOUT_S = 300


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def missing_sources() -> list[Path]:
    sources = DEBIAN_GOCODE / "src"
    needed = (sources / "google.golang.org" / "grpc", sources / "github.com" / "golang" / "protobuf")
    return [p for p in needed if not p.exists()]


def missing_toolchain() -> str | None:
    """Why a build cannot run here (with the apt-get line that fixes it), or None."""
    missing = [*missing_programs(), *map(str, missing_sources())]
    return f"{' and '.join(missing)} missing ({INSTALL})" if missing else None


def go_environment(gopath: Path) -> dict[str, str]:
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:{DEBIAN_GOCODE}", "GOFLAGS": ""}
    # go keeps its build cache under the user's cache directory; without a home, a temporary one
    if "GOCACHE" not in env and not os.environ.get("HOME"):
        env["GOCACHE"] = str(gopath / "cache")
    return env


class BuildError(RuntimeError):
    pass


def run_checked(cmd: list[str], env: dict[str, str], cwd: Path) -> None:
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if run.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}: exit {run.returncode}\n{run.stdout}\n{run.stderr}")


def build(source: Path, workdir: Path) -> Path:
    """Builds the Go program in folder ``source`` (a ``main`` package importing
    ``seqserve/inference``) under ``workdir``; returns the binary, named as the folder."""
    gopath = workdir / "gopath"
    generated = gopath / "src" / GENERATED_PACKAGE
    generated.mkdir(parents=True, exist_ok=True)
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
        ROOT,
    )
    name = source.name
    shutil.copytree(source, gopath / "src" / name, dirs_exist_ok=True)
    binary = workdir / name
    run_checked(["go", "build", "-o", str(binary), name], env, gopath)
    return binary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.golang.build OUT_DIR", file=sys.stderr)
        return 2
    why = missing_toolchain()
    if why:
        print(f"cannot build seqload: {why}", file=sys.stderr)
        return 1
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    print(build(SEQLOAD_SOURCE, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
