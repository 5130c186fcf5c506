"""An isolated instance's process: ``python -m seqserve.engine.isolation.child FD...``.

The server starts one per isolated model instance, in a fresh interpreter (never a fork of the
threaded server), passing seven descriptors: three for the batch channel, three for the event
channel (see ``channel``) and the read end of a pipe whose write end only the server holds
(its end of file means the server is gone, and the child exits even when the model is stuck
in ``execute``).

The child loads the model with the model's own backend, exactly as the server would in
process, then serves the batch channel: one ``EXEC`` at a time, ``execute`` on a batch of
read-only views onto the request slab, the result copied into the reply slab. Responders
(decoupled models, Triton response senders) relay each response to the server over the event
channel and wait for its answer, so ``send`` raises the same errors as in process and the
response slab can be reused as soon as ``send`` returns.
"""

from __future__ import annotations

import functools
import logging
import marshal
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import InstanceContext, ModelContext, find_backend
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation import batches, results
from seqserve.engine.isolation import protocol as p
from seqserve.engine.isolation.channel import Channel, ChannelClosed, child_channel
from seqserve.engine.isolation.metrics_forwarding import MetricsForwarder
from seqserve.engine.responses import Outcome, Responder

log = logging.getLogger("seqserve.isolation")

#: exit status when the server went away while this child was busy
EXIT_ORPHANED = 70


class EventClient:
    """The child's side of the event channel: one request/reply exchange at a time."""

    def __init__(self, channel: Channel, names: tuple[str, ...]) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._writer = results.ResponseWriter(names)

    def responder(self, token: int, index: int) -> Responder:
        return Responder(functools.partial(self.send, token, index), functools.partial(self.cancelled, token, index))

    def send(self, token: int, index: int, outcome: Outcome, final: bool) -> None:
        with self._lock:
            body, fds = self._writer.encode(token, index, outcome, final)
            reply = self._exchange(body, fds)
        if isinstance(reply, InferenceError):
            raise reply

    def cancelled(self, token: int, index: int) -> bool:
        with self._lock:
            reply = self._exchange(results.encode_cancelled_query(token, index), [])
        return reply is True

    def log(self, level: int, name: str, text: str) -> bool:
        """Hand a log record to the server; False when the server is gone."""
        with self._lock:
            return self._exchange(results.encode_log(level, name, text), []) is True

    def metrics(self, message: bytes) -> bool:
        """Hand the model's custom metrics (a METRICS message) to the server."""
        with self._lock:
            return self._exchange(message, []) is True

    def _exchange(self, body: bytes, fds: list[int]) -> bool | InferenceError:
        try:
            self._channel.send(body, fds)
            answer, _ = self._channel.recv()
            return results.decode_reply(answer)
        except ChannelClosed:
            return InferenceError(Code.UNAVAILABLE, "Unable to send response. The server has stopped.")


def _watch_parent(life_fd: int) -> None:
    """Exit when the server is gone (the pipe's only writer closed), whatever the model does."""
    try:
        while os.read(life_fd, 1):
            pass
    except OSError:
        pass
    os._exit(EXIT_ORPHANED)


class ForwardHandler(logging.Handler):
    """Sends every log record to the server, which logs it under the same logger name."""

    def __init__(self, client: EventClient, tag: str) -> None:
        super().__init__()
        self._client = client
        self._tag = tag

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if not self._client.log(record.levelno, record.name, text):
                sys.stderr.write(f"{self._tag}: {text}\n")
        except Exception:
            self.handleError(record)


def _setup(init: dict[str, Any], client: EventClient) -> None:
    for entry in init.get("sys_path", ()):
        if entry not in sys.path:
            sys.path.append(entry)
    root = logging.getLogger()
    root.handlers[:] = [ForwardHandler(client, f"{init['instance_name']} (pid {os.getpid()})")]
    level = int(init.get("log_level", logging.INFO))
    root.setLevel(max(level, logging.INFO))  # libraries never verbose
    logging.getLogger("seqserve").setLevel(level)


def _create_instance(init: dict[str, Any], cfg: mc.ModelConfig) -> Any:
    model_dir = Path(init["model_dir"])
    ctx = ModelContext(
        name=cfg.name,
        version=init["version"],
        config=cfg,
        model_dir=model_dir,
        version_dir=model_dir / str(init["version"]),
        parameters=dict(init["parameters"]),
    )
    backend = find_backend(cfg)(ctx)
    ictx = InstanceContext(ctx, init["instance_index"], init["instance_name"], init["device"])
    return backend.create_instance(ictx)


def _failure(e: BaseException, name: str) -> InferenceError:
    """The error a failed execute gives, worded as the server words it for in-process models."""
    if isinstance(e, InferenceError):
        return e
    return InferenceError(Code.INTERNAL, f"model '{name}' failed: {type(e).__name__}: {e}")


def _same_buffer_states(cfg: mc.ModelConfig) -> list[tuple[str, str]]:
    """(input name, output name) of the fixed-shape states with use_same_buffer_for_input_output."""
    return [
        (st.input_name or st.name, st.output_name or st.name)
        for st in cfg.sequence_batching.state
        if st.use_same_buffer_for_input_output and -1 not in st.dims and st.data_type != mc.TYPE_STRING
    ]


def _writable_states(ebatch: ExecuteBatch, same_buffer: list[tuple[str, str]]) -> None:
    # The state arrived through shared memory: the model writes into its own copy, which goes
    # back as the output state (the copy path; a failed batch keeps nothing of it).
    states = dict(ebatch.states)
    for in_name, _out in same_buffer:
        if in_name in states:
            states[in_name] = np.array(states[in_name])
    ebatch.states = states


def _with_same_buffer_states(ebatch: ExecuteBatch, produced: Any, same_buffer: list[tuple[str, str]]) -> Any:
    """What was written in place is the next state even when the model does not return it."""
    if produced is not None and not isinstance(produced, dict):
        return produced  # the writer reports what is wrong with it
    out = dict(produced or {})
    for in_name, out_name in same_buffer:
        if out.get(out_name) is None and in_name in ebatch.states:
            out[out_name] = ebatch.states[in_name]
    return out


def serve(batch: Channel, events: Channel) -> int:
    body, _fds = batch.recv()
    if p.kind_of(body) != p.INIT:
        return 2
    init = marshal.loads(body[1:])
    cfg = mc.ModelConfig()
    cfg.ParseFromString(init["config"])
    names = p.result_names(cfg)
    events_client = EventClient(events, names)
    _setup(init, events_client)
    try:
        instance = _create_instance(init, cfg)
    except BaseException as e:  # the server reports it as the load failure
        err = e if isinstance(e, InferenceError) else InferenceError(Code.INTERNAL, f"{type(e).__name__}: {e}")
        batch.send(p.code_message(p.INIT_FAILED, err.code, err.message))
        return 0
    uses_responders = bool(instance.uses_responders)
    client = events_client if uses_responders else None
    reader = batches.BatchReader()
    writer = results.ResultWriter(names)
    index = int(init["instance_index"])
    batched = cfg.max_batch_size > 0
    model = cfg.name
    execute = instance.execute
    same_buffer = _same_buffer_states(cfg)
    forwarder = MetricsForwarder(events_client.metrics)
    batch.send(bytes((p.READY, uses_responders)))
    while True:
        try:
            body, fds = batch.recv()
        except ChannelClosed:
            return 0
        kind = body[0]
        if kind == p.EXEC:
            token, ebatch = reader.decode(body, fds, index, batched)
            del body
            if client is not None:
                ebatch.responder = functools.partial(client.responder, token)
            produced = None
            try:
                if same_buffer:
                    _writable_states(ebatch, same_buffer)
                produced = execute(ebatch)
                if same_buffer:
                    produced = _with_same_buffer_states(ebatch, produced, same_buffer)
                reply, out_fds = writer.encode(produced)
            except Exception as e:
                err = _failure(e, model)
                reply, out_fds = p.code_message(p.FAILED, err.code, err.message), []
            del ebatch, produced
            batch.send(reply, out_fds)
        elif kind == p.FINALIZE:
            message = ""
            try:
                instance.finalize()
            except Exception as e:
                message = f"{type(e).__name__}: {e}"
            forwarder.close()
            batch.send(bytes((p.FINALIZED,)) + message.encode("utf-8", "replace"))
            return 0
        else:
            log.error("unexpected message kind %d from the server", kind)
            return 2


def main(argv: list[str] | None = None) -> int:
    fds = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when its instances stop
    os.set_inheritable(fds[6], False)
    threading.Thread(target=_watch_parent, args=(fds[6],), name="seqserve-parent-watch", daemon=True).start()
    return serve(child_channel(*fds[0:3]), child_channel(*fds[3:6]))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: model threads must not keep a finished child alive
