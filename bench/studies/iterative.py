"""The cost of one rescheduled iteration (iterative sequences) against a client-driven step.

    python -m bench.studies.iterative
    python -m bench.studies.iterative --sequences 1,8 --steps 200 --reps 3 --json PATH

Two Triton-style Python models (decoupled, ``max_batch_size`` 8, one instance, a no-op step
that answers one INT32) in process, driven through ``Server.submit_streaming`` on one event loop:

  rescheduled    ``sequence_batching { iterative_sequence: true }``: one request per sequence;
                 each step sends its response and releases the request with
                 ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` until ``--steps`` steps have run
  client-driven  an ordinary sequence model: the client sends each step as a request of the
                 sequence (START ... END) once the previous step's response has come

``--sequences`` sequences run at once (their steps batch together). Printed per configuration:
microseconds of wall clock per step (median over reps) and the process's CPU time per step.
The rescheduled step skips the client's round trip (response to the loop, a new request
validated and queued), and pays the reschedule instead (the request queued again from the
executor thread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.engine import Server

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            cid = request.correlation_id()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            left = self.left.get(cid, n) - 1
            out = pb_utils.InferenceResponse([pb_utils.Tensor("LEFT", np.array([[left]], np.int32))])
            sender = request.get_response_sender()
            if ITERATIVE and left > 0:
                self.left[cid] = left
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
            else:
                self.left.pop(cid, None)
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ iterative_sequence: {iterative} max_sequence_idle_microseconds: 60000000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def write_models(repo: Path) -> None:
    for name, iterative in (("rescheduled", True), ("client_driven", False)):
        d = repo / name
        (d / "1").mkdir(parents=True)
        (d / "config.pbtxt").write_text(CONFIG.format(name=name, iterative=str(iterative).lower()))
        (d / "1" / "model.py").write_text(f"ITERATIVE = {iterative}\n" + MODEL)


async def run_rescheduled(server: Server, sequences: int, steps: int) -> None:
    loop = asyncio.get_running_loop()
    done: list[asyncio.Future[int]] = []
    for _ in range(sequences):
        fut: asyncio.Future[int] = loop.create_future()
        count = [0]

        def on_response(result: Any, final: bool, fut: asyncio.Future[int] = fut, count: list[int] = count) -> None:
            count[0] += result is not None and not isinstance(result, Exception)
            if isinstance(result, Exception):
                fut.set_exception(result)
            elif final:
                fut.set_result(count[0])

        server.submit_streaming("rescheduled", {"N": np.array([[steps]], np.int32)}, on_response)
        done.append(fut)
    counts = await asyncio.gather(*done)
    assert counts == [steps] * sequences, counts


async def run_client_driven(server: Server, sequences: int, steps: int, first_id: int) -> None:
    loop = asyncio.get_running_loop()

    async def one(sid: int) -> None:
        for t in range(steps):
            fut: asyncio.Future[None] = loop.create_future()

            def on_response(result: Any, final: bool, fut: asyncio.Future[None] = fut) -> None:
                if isinstance(result, Exception):
                    fut.set_exception(result)
                elif final and not fut.done():
                    fut.set_result(None)

            server.submit_streaming(
                "client_driven",
                {"N": np.array([[1]], np.int32)},
                on_response,
                sequence_id=sid,
                sequence_start=t == 0,
                sequence_end=t == steps - 1,
            )
            await fut

    await asyncio.gather(*(one(first_id + i) for i in range(sequences)))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="seqserve-iterative-") as tmp:
        repo = Path(tmp)
        write_models(repo)
        server = Server(repo)
        await server.start()
        next_id = 1
        try:
            await run_rescheduled(server, 1, 20)  # warm-up: imports, first allocations
            await run_client_driven(server, 1, 20, 10**9)
            for sequences in args.sequences:
                for _ in range(args.reps):
                    for kind in ("rescheduled", "client_driven"):
                        wall0, cpu0 = time.perf_counter(), time.process_time()
                        if kind == "rescheduled":
                            await run_rescheduled(server, sequences, args.steps)
                        else:
                            await run_client_driven(server, sequences, args.steps, next_id)
                            next_id += sequences
                        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                        n = sequences * args.steps
                        key = f"{kind}/{sequences}"
                        entry = results.setdefault(key, {"wall_us": [], "cpu_us": []})
                        entry["wall_us"].append(wall / n * 1e6)
                        entry["cpu_us"].append(cpu / n * 1e6)
        finally:
            await server.shutdown(timeout_s=10)
    return results


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.studies.iterative", description=doc)
    p.add_argument("--sequences", default="1,8", help="sequences at once, comma-separated (default 1,8)")
    p.add_argument("--steps", type=int, default=200, help="steps per sequence (default 200)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per configuration (default 3)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    args.sequences = [int(s) for s in args.sequences.split(",") if s.strip()]
    results = asyncio.run(measure(args))
    print(
        f"# python -m bench.studies.iterative --sequences {','.join(map(str, args.sequences))} "
        f"--steps {args.steps} --reps {args.reps}"
    )
    print(f"{'configuration':<22} {'wall us/step (median)':>22} {'cpu us/step (median)':>21}")
    for key, entry in results.items():
        wall, cpu = statistics.median(entry["wall_us"]), statistics.median(entry["cpu_us"])
        print(f"{key:<22} {wall:>22.1f} {cpu:>21.1f}")
    for sequences in args.sequences:
        r = statistics.median(results[f"rescheduled/{sequences}"]["wall_us"])
        c = statistics.median(results[f"client_driven/{sequences}"]["wall_us"])
        print(
            f"sequences {sequences}: a rescheduled step costs {r:.1f} us, a client-driven step {c:.1f} us "
            f"({r / c:.2f}x)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
