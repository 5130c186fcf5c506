"""What every floor answers: fixed metadata and an echo reply."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

INPUT_NAME = "INPUT"
OUTPUT_NAME = "OUTPUT"
DATATYPE = "FP32"
SHAPE = [-1, 1]

# KServe v2 datatype -> element size in bytes (BYTES: variable)
DTYPE_SIZE = {
    "BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2,
    "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8,
}  # fmt: skip


def model_metadata(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "versions": ["1"],
        "platform": "floor",
        "inputs": [{"name": INPUT_NAME, "datatype": DATATYPE, "shape": SHAPE}],
        "outputs": [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": SHAPE}],
    }


def parse_args(prog: str, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="A floor KServe v2 server (see bench/floors/__init__.py).")
    p.add_argument("port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    return p.parse_args(argv)


def result_of(coro: Any) -> Any:
    """The value of a coroutine that never suspends (the floor servicer's rpcs), without a loop:
    for the floors whose handlers are not coroutines."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the floor's rpc suspended")


def stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the floors' servers run until it is."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_protocol(factory: Callable[[], asyncio.Protocol], host: str, port: int) -> None:
    """Serve an asyncio protocol (the floors without a server framework) until the process ends."""
    server = await asyncio.get_running_loop().create_server(factory, host, port)
    async with server:
        await server.serve_forever()


def run_on_uvloop(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the bench extra installs it
        asyncio.run(coro)
        return
    uvloop.run(coro)


def serve_main(prog: str, serve: Callable[[str, int], Awaitable[None]], argv: list[str] | None = None) -> int:
    """A floor script's ``main``: ``PORT [--host H]``, then ``serve(host, port)`` on uvloop until a
    signal ends it."""
    args = parse_args(prog, argv)
    run_on_uvloop(serve(args.host, args.port))
    return 0
