"""Request tracing as Triton's: a 3-step sequence traced into Triton's JSON trace file and
exported over OTLP/HTTP to a real receiver (a small HTTP server here that decodes the protobuf
with opentelemetry-proto's classes), the trace extension on HTTP and gRPC, and tracing off by
default."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.checks import wait_until_sync
from tests.support.clients import http_request, new_int_id
from tests.support.process import ServerProcess

NAMES = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
         "COMPUTE_END", "REQUEST_END"]  # fmt: skip
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


def three_steps(srv: ServerProcess, sid: int, headers: dict[str, str] | None = None) -> list[float]:
    cl = httpclient.InferenceServerClient(srv.http_url)
    try:
        out = []
        for i, (v, start, end) in enumerate([(1.0, True, False), (2.0, False, False), (3.0, False, True)]):
            inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[v]], np.float32))
            res = cl.infer(
                "accumulator",
                [inp],
                sequence_id=sid,
                sequence_start=start,
                sequence_end=end,
                headers=headers if i == 0 else None,
            )
            out.append(float(res.as_numpy("OUTPUT")[0, 0]))
        return out
    finally:
        cl.close()


def test_trace_file_holds_the_steps_of_a_sequence(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    srv = launch(
        None,
        *("--trace-config", f"triton,file={trace}", "--trace-config", "triton,log-frequency=3"),
        *("--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS", "--trace-config", "level=TENSORS"),
    )
    sid = new_int_id()
    assert three_steps(srv, sid) == [1.0, 3.0, 6.0]
    first = Path(f"{trace}.0")  # log-frequency 3: the first three traces go to <file>.0
    wait_until_sync(first.exists, "the trace file is written")
    entries = json.loads(first.read_text())
    heads = [e for e in entries if "model_name" in e]
    assert len(heads) == 3
    assert [(h["sequence_start"], h["sequence_end"]) for h in heads] == [(True, False), (False, False), (False, True)]
    for h in heads:
        assert h["model_name"] == "accumulator" and h["model_version"] == 1
        assert h["sequence_id"] == sid and h["batch_size"] >= 1 and h["slot"] >= 0
        stamps = [e["timestamps"][0] for e in entries if e["id"] == h["id"] and "timestamps" in e]
        assert [s["name"] for s in stamps] == NAMES
        assert all(a["ns"] <= b["ns"] for a, b in itertools.pairwise(stamps))
        tensors = {e["activity"]: e["tensor"] for e in entries if e["id"] == h["id"] and "activity" in e}
        assert tensors["TENSOR_QUEUE_INPUT"]["name"] == "INPUT"
        assert tensors["TENSOR_QUEUE_INPUT"]["dtype"] == "FP32"
        assert tensors["TENSOR_BACKEND_OUTPUT"]["name"] == "OUTPUT"
    assert len({h["slot"] for h in heads}) == 1  # a sequence keeps its slot


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on a free port: decodes every export it gets."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[Any] = []
        self.paths: list[str] = []
        lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with lock:
                    receiver.paths.append(self.path)
                    for rs in req.resource_spans:
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    if os.environ.get("CI") == "true":  # the test extra brings it: missing is a failure there
        import opentelemetry.sdk  # noqa: F401
    else:
        pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    r = OtlpReceiver()
    yield r
    r.close()


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_otlp_export_holds_the_steps_of_a_sequence(
    launch: Callable[..., ServerProcess], receiver: OtlpReceiver
) -> None:
    srv = launch(
        None,
        *("--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={receiver.url}"),
        *("--trace-config", "opentelemetry,bsp_schedule_delay=50", "--trace-config", "rate=1"),
        *("--trace-config", "level=TIMESTAMPS", "--trace-config", "opentelemetry,resource=deployment=test"),
    )
    sid = new_int_id()
    assert three_steps(srv, sid, headers={"traceparent": TRACEPARENT}) == [1.0, 3.0, 6.0]
    wait_until_sync(lambda: len(receiver.spans) >= 9, "the 9 spans of 3 requests are exported")
    assert set(receiver.paths) == {"/v1/traces"}
    models = [s for s in receiver.spans if s.name == "accumulator"]
    assert len(models) == 3
    steps = sorted(
        (attrs(s) for s in models), key=lambda a: (not a["seqserve.sequence_start"], a["seqserve.sequence_end"])
    )
    assert [(a["seqserve.sequence_start"], a["seqserve.sequence_end"]) for a in steps] == [
        (True, False), (False, False), (False, True)
    ]  # fmt: skip
    for a in steps:
        assert a["seqserve.sequence_id"] == str(sid)
        assert a["triton.model_name"] == "accumulator" and a["triton.model_version"] == 1
        assert a["seqserve.batch_size"] >= 1 and a["seqserve.slot"] >= 0
        assert a["seqserve.queue_ns"] >= 0 and a["seqserve.compute_infer_ns"] >= 0
    for m in models:
        assert {e.name for e in m.events} == {"REQUEST_START", "QUEUE_START", "REQUEST_END"}
    computes = [s for s in receiver.spans if s.name == "compute"]
    assert len(computes) == 3
    assert {e.name for e in computes[0].events} == {n for n in NAMES if n.startswith("COMPUTE")}
    roots = [s for s in receiver.spans if s.name == "InferRequest"]
    # the first step's client sent a traceparent: its spans continue the client's trace
    parented = [r for r in roots if r.trace_id.hex() == PARENT_TRACE]
    assert len(parented) == 1 and parented[0].parent_span_id.hex() == "00f067aa0ba902b7"
    assert {m.parent_span_id for m in models} == {r.span_id for r in roots}
    # a gRPC stream's traceparent (call metadata) is the parent of its requests' traces
    stream_trace = "0af7651916cd43dd8448eb211c80319c"
    done = threading.Event()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(
        lambda result, error: done.set(), headers={"traceparent": f"00-{stream_trace}-b7ad6b7169203331-01"}
    )
    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[5.0]], np.float32))
    client.async_stream_infer("accumulator", [inp], sequence_id=new_int_id(), sequence_start=True, sequence_end=True)
    assert done.wait(30)
    client.stop_stream()
    client.close()
    wait_until_sync(
        lambda: any(s.name == "InferRequest" and s.trace_id.hex() == stream_trace for s in list(receiver.spans)),
        "the stream request's trace continues the stream's",
    )


def test_trace_settings_over_http_and_grpc(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    srv = launch(None, "--trace-config", f"triton,file={tmp_path / 't.json'}")
    r = http_request(srv, "GET", "/v2/trace/setting")
    assert r.status == 200
    doc = json.loads(r.body)
    assert doc["trace_level"] == ["OFF"] and doc["trace_rate"] == "1000" and doc["trace_count"] == "-1"
    assert doc["trace_mode"] == "triton" and doc["trace_file"] == str(tmp_path / "t.json")
    assert "trace" in json.loads(http_request(srv, "GET", "/v2").body)["extensions"]
    # a model's own settings; the others follow the global ones
    r = http_request(
        srv, "POST", "/v2/models/accumulator/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    )
    assert r.status == 200, r.body
    assert json.loads(r.body)["trace_level"] == ["TIMESTAMPS"]
    assert json.loads(http_request(srv, "GET", "/v2/trace/setting").body)["trace_level"] == ["OFF"]
    # the same over gRPC, with tritonclient
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    got = client.get_trace_settings(model_name="accumulator", as_json=True)
    assert got["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    got = client.update_trace_settings(settings={"trace_count": "5"}, as_json=True)
    assert got["settings"]["trace_count"]["value"] == ["5"]
    # bad settings: 400 with what is wrong; a client cannot choose where the server writes
    for body, fragment in [
        ({"trace_rate": "zero"}, "not an integer"),
        ({"trace_level": ["LOUD"]}, "OFF, TIMESTAMPS or TENSORS"),
        ({"trace_file": "/etc/passwd"}, "cannot be changed"),
        ({"nope": "1"}, "unknown trace setting"),
    ]:
        r = http_request(srv, "POST", "/v2/trace/setting", body)
        assert r.status == 400 and fragment in r.body.decode(), (body, r.body)
    assert http_request(srv, "GET", "/v2/models/nope/trace/setting").status == 404
    # a traced request still answers as before, and its trace is written at exit
    assert three_steps(srv, new_int_id()) == [1.0, 3.0, 6.0]
