"""Every example in README.md, docs/ and deploy/ runs as written and prints what it says.

A page runs top to bottom as a reader would run it in one terminal, in a fresh folder: each
`python` block as a program, each `bash`/`sh` block command by command. Files a block writes are
there for the next. `seqserve serve` runs in the background on free ports until the page is done,
and the blocks after it talk to it; before a page starts its own server they talk to a server of
the demo models that the test starts. Either way `localhost:8000`, `:8001` and `:8002` in a block
are rewritten to that server's HTTP, gRPC and metrics ports: no fixed port is bound.

What a block says it prints is checked:
- python: the comment of a line that calls `print(`, up to its first `: ` or `; `; its
  comma-separated parts (`[[1.]], [[3.]]`) must appear in the output, in that order;
- bash: the comment lines right under a command (no blank line between) are its output; the
  parts between `...` must appear in the output, in that order.
Spaces are ignored in both. Blocks marked `norun` (see tests/docs/markdown.py) are checked for
syntax only. A block must end the sequences it starts on the demo server: none may be left to
wait out its idle timeout. A block that imports torch skips the rest of its page when torch is
missing (an optional extra), unless SEQSERVE_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tokenize
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs.markdown import NORUN, ROOT, RUNNABLE_LANGUAGES, CodeBlock, code_blocks, pages

PAGES = [page for page in pages() if "bench" not in page.relative_to(ROOT).parts]  # bench/: benchmarks, not run here
TEXT_LANGUAGES = ("", "text", "json", "yaml", "protobuf")
DEFAULT_PORTS = {"8000": "http", "8001": "grpc", "8002": "metrics"}
STEP_TIMEOUT_S = 120
READY_TIMEOUT_S = 60


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    def rewrite(self, text: str) -> str:
        """The default ports after `localhost:` or `127.0.0.1:` replaced by these."""
        return re.sub(
            r"\b(localhost|127\.0\.0\.1):(800[012])\b",
            lambda m: f"{m.group(1)}:{getattr(self, DEFAULT_PORTS[m.group(2)])}",
            text,
        )


@dataclass
class Terminal:
    """The folder, environment and background servers of one page's run."""

    cwd: Path
    ports: Ports
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if p)
        return env

    def stop(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_server(args: list[str], term: Terminal, log_name: str) -> Ports:
    """`seqserve serve ...` in the background on free ports, once it answers ready."""
    flags = {"--http-port", "--grpc-port", "--metrics-port"}
    kept: list[str] = []
    skip = False
    for arg in args:  # drop any ports the text gives: free ones replace them
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif arg.split("=", 1)[0] not in flags:
            kept.append(arg)
    http, grpc, metrics = free_ports(3)
    ports = Ports(http, grpc, metrics)
    cmd = [*kept, "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    log = (term.cwd / log_name).open("wb")
    proc = subprocess.Popen(cmd, cwd=term.cwd, env=term.env, stdout=log, stderr=subprocess.STDOUT)
    term.servers.append(proc)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:  # its log says when every port listens and the models are ready
        text = (term.cwd / log_name).read_text()
        if proc.poll() is not None:
            pytest.fail(f"{shlex.join(cmd)} exited {proc.returncode}:\n{text}")
        if re.search(r'\] "seqserve \S+ ready"$', text, re.M):  # Triton's default log format
            return ports
        time.sleep(0.1)
    pytest.fail(f"{shlex.join(cmd)} not ready in {READY_TIMEOUT_S} s:\n{(term.cwd / log_name).read_text()}")


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    term = Terminal(tmp_path_factory.mktemp("demo-server"), Ports(0, 0, 0))
    try:
        yield start_server(["seqserve", "serve"], term, "server.log")
    finally:
        term.stop()


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def assert_in_order(parts: list[str], output: str, where: str) -> None:
    flat, at = squeeze(output), 0
    for part in parts:
        found = flat.find(squeeze(part), at)
        assert found >= 0, f"{where}: the output lacks {part!r} (in this order):\n{output}"
        at = found + len(squeeze(part))


def top_level_split(text: str, sep: str = ",") -> list[str]:
    """`text` split at `sep` outside brackets: `[[1.]], (1, 16)` is two parts."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip() for p in [*parts, current] if p.strip()]


def printed_claims(source: str) -> list[str]:
    """What a Python example's comments on its `print(` lines say it prints."""
    lines = source.splitlines()
    claims: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and "print(" in lines[tok.start[0] - 1][: tok.start[1]]:
            said = re.split(r": |; ", tok.string.lstrip("#").strip(), maxsplit=1)[0]
            claims += top_level_split(said)
    return claims


def needs_torch(block: CodeBlock) -> bool:
    return re.search(r"^\s*(import torch|from torch\b)", block.text, re.M) is not None


def torch_missing() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return True
    return False


def run_python(block: CodeBlock, term: Terminal) -> None:
    script = term.cwd / f"example_{block.path.stem}_{block.line}.py"
    script.write_text(term.ports.rewrite(block.text))
    command = [sys.executable, str(script)]
    out = subprocess.run(command, cwd=term.cwd, env=term.env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert out.returncode == 0, f"{block.where()} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    assert_in_order(printed_claims(block.text), out.stdout, block.where())


@dataclass(frozen=True)
class Command:
    text: str
    output: list[str]  # the comment lines right under it


def shell_commands(text: str) -> list[Command]:
    """A shell block's commands: a command goes on while a quote is open, a line ends in `\\`,
    or a here-document is open."""
    commands: list[Command] = []
    current: list[str] = []
    heredoc: str | None = None
    last: Command | None = None
    for line in text.splitlines():
        if current:
            current.append(line)
            if heredoc is not None:
                if line.strip() == heredoc:
                    heredoc = None
                else:
                    continue
        elif not line.strip():
            last = None
            continue
        elif line.lstrip().startswith("#"):
            if last is not None:
                last.output.append(line.lstrip()[1:].strip())
            continue
        else:
            current = [line]
            opened = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
            if opened:
                heredoc = opened.group(1)
                continue
        joined = "\n".join(current)
        if joined.endswith("\\"):
            continue
        try:
            shlex.split(joined, comments=True)
        except ValueError:  # an open quote
            continue
        last = Command(joined, [])
        commands.append(last)
        current = []
    assert not current, f"an unfinished command: {current}"
    return commands


def run_shell(block: CodeBlock, term: Terminal) -> None:
    for command in shell_commands(block.text):
        words = shlex.split(command.text, comments=True)
        if words[:2] == ["seqserve", "serve"]:
            term.ports = start_server(words, term, f"server_{block.line}.log")
            continue
        out = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + term.ports.rewrite(command.text)],
            cwd=term.cwd,
            env=term.env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
        where = f"{block.where()}: {command.text.splitlines()[0]}"
        assert out.returncode == 0, f"{where} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        claims = [part for said in command.output for part in said.split("...") if part.strip()]
        assert_in_order(claims, out.stdout, where)


DEMO_SEQUENCE_MODELS = sorted(
    config.parent.name
    for config in (ROOT / "src" / "seqserve" / "examples" / "models").glob("*/config.pbtxt")
    if "sequence_batching" in config.read_text()
)


def live_sequences(ports: Ports) -> dict[str, list[object]]:
    """The demo server's live sequences, by model (the sequence API)."""
    live: dict[str, list[object]] = {}
    for model in DEMO_SEQUENCE_MODELS:
        url = f"http://127.0.0.1:{ports.http}/v2/models/{model}/sequences"
        with urllib.request.urlopen(url, timeout=10) as reply:
            ids = [s["id"] for s in json.load(reply)["sequences"]]
        if ids:
            live[model] = ids
    return live


def assert_sequences_ended(block: CodeBlock, ports: Ports) -> None:
    """An example ends the sequences it starts: none is left to wait out its idle timeout."""
    deadline = time.monotonic() + 2
    while (live := live_sequences(ports)) and time.monotonic() < deadline:
        time.sleep(0.05)  # an END's reply may reach the client just before its slot is freed
    assert not live, f"{block.where()} left sequences live on the demo server: {live}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run_as_written(page: Path, demo_server: Ports, tmp_path: Path) -> None:
    term = Terminal(tmp_path, demo_server)
    try:
        for block in code_blocks(page):
            if not block.runnable:
                continue
            if needs_torch(block) and torch_missing():
                if os.environ.get("SEQSERVE_REQUIRE_TORCH") == "1":
                    pytest.fail(f"{block.where()} needs torch, and SEQSERVE_REQUIRE_TORCH=1")
                pytest.skip(f"{block.where()} and the page's examples after it need torch (pip install '.[torch]')")
            if block.language == "python":
                run_python(block, term)
            else:
                run_shell(block, term)
            assert_sequences_ended(block, demo_server)
    finally:
        term.stop()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_excerpts_parse_and_every_block_is_known(page: Path) -> None:
    for block in code_blocks(page):
        assert block.language in RUNNABLE_LANGUAGES + TEXT_LANGUAGES, (
            f"{block.where()}: fence `{block.info}`: use one of {RUNNABLE_LANGUAGES + TEXT_LANGUAGES}, so that a "
            "runnable example cannot hide under another name"
        )
        if block.runnable or block.language not in RUNNABLE_LANGUAGES:
            continue
        assert NORUN in block.info.split()
        if block.language == "python":
            try:
                ast.parse(textwrap.dedent(block.text))
            except SyntaxError as e:
                pytest.fail(f"{block.where()}: {e}")
        else:
            out = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, f"{block.where()}: {out.stderr}"


def test_shell_commands_and_their_output() -> None:
    text = (
        'curl -s x -d \'{"a":\n  1}\'\n# {"b": 2}\n\n# a note\ncat > f <<\'EOF\'\nname: "m"\nEOF\n'
        "seqserve serve \\\n  --x 1   # a comment\n"
    )
    commands = shell_commands(text)
    assert [c.text for c in commands] == [
        "curl -s x -d '{\"a\":\n  1}'",
        "cat > f <<'EOF'\nname: \"m\"\nEOF",
        "seqserve serve \\\n  --x 1   # a comment",
    ]
    assert [c.output for c in commands] == [['{"b": 2}'], [], []]
    claims = printed_claims("print(x)  # [[1.]], [[3.]]: the sums\nprint(y)  # (1, 16)\n")
    assert claims == ["[[1.]]", "[[3.]]", "(1, 16)"]
    rewritten = Ports(1, 2, 3).rewrite("localhost:8000 127.0.0.1:8002 localhost:80001")
    assert rewritten == "localhost:1 127.0.0.1:3 localhost:80001"
