"""The server's side of a process-isolated instance: a ``BackendInstance`` whose ``execute``
runs the batch in a child process, and the supervision of that process.

Threads, per instance: the core's executor thread (``execute``: request slab, ``EXEC``,
waits for ``RESULT`` with the GIL released); a reaper per child, blocked in ``waitpid``, which
notices every exit (even while idle), wakes a waiting ``execute``, logs the death once,
fails the requests the child still owed responses to, and restarts the instance (with a
backoff when it keeps dying); an event thread per child whose model answers through
responders, relaying its responses to the engine's real ``Responder``s (``LateResponses``,
responses.py).

The implicit state never leaves the server's core: the child gets it with each batch and
returns the next one. A child that dies fails its batch and nothing else; its sequences
continue on the restarted child from their last stored state.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import marshal
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, ClassVar

import seqserve
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext, RequestResults
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.custom_metrics import counter
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation import batches, results
from seqserve.engine.isolation import protocol as p
from seqserve.engine.isolation.channel import ChannelClosed, Ends
from seqserve.engine.isolation.child_process import (
    BACKOFF_BASE_S,
    ChildProcess,
    backoff_delay,
    exit_status,
)
from seqserve.engine.isolation.metrics_forwarding import forget_source, receive_snapshot
from seqserve.engine.isolation.responses import BatchResponders, LateResponses
from seqserve.engine.responses import DEFERRED

log = logging.getLogger("seqserve.model")

#: how long a batch waits for its instance to come back after a crash
RESTART_WAIT_S = 60.0
#: a child that dies sooner than this after starting counts towards the restart backoff
QUICK_DEATH_S = 10.0
#: how long finalize may take in the child before it is killed
FINALIZE_TIMEOUT_S = 30.0

_PACKAGE_ROOT = str(Path(seqserve.__file__).resolve().parent.parent)


#: restarts of isolated instances, on /metrics (labels model, version, instance)
RESTARTS = ("seqserve_isolated_restarts_total", "Times an isolated model process was restarted after it exited")


class IsolatedInstance(BackendInstance):
    """A model instance that runs in a child process (``parameters { key: "isolation" ... }``)."""

    # The engine hands every batch its responders; the child uses them when its model does.
    uses_responders: ClassVar[bool] = True

    def __init__(self, ictx: InstanceContext, *, execute_timeout_s: float | None = None) -> None:
        ctx = ictx.model
        self.model = ctx.name
        self.name = ictx.name
        self._labels = {"model": ctx.name, "version": str(ctx.version), "instance": ictx.name}
        self._metrics_source = f"{ctx.name}/{ctx.version}/{ictx.name}"  # its forwarded custom metrics
        self._restarts = counter(*RESTARTS, self._labels)  # on /metrics from the start, at 0
        self._decoupled = ctx.config.model_transaction_policy.decoupled
        self._timeout_s = execute_timeout_s
        self._names = p.result_names(ctx.config)
        self._init = bytes((p.INIT,)) + marshal.dumps(
            {
                "config": ctx.config.SerializeToString(),
                "version": ctx.version,
                "model_dir": str(ctx.model_dir),
                "parameters": dict(ctx.parameters),
                "instance_index": ictx.index,
                "instance_name": ictx.name,
                "device": ictx.device,
                "sys_path": [e for e in sys.path if e],
                # seqserve's loggers' level (verbose or not); libraries stay at INFO or above
                "log_level": logging.getLogger("seqserve").getEffectiveLevel(),
            }
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if x)
        self._env = env
        self._cond = threading.Condition(threading.Lock())
        self._child: ChildProcess | None = None  # serving child; None while restarting
        self._starting = False  # a (re)start is under way
        self._retry_at = 0.0  # while waiting to restart: when the next attempt starts
        self._last_failure = ""
        self._closed = False
        self._aborted = False  # a forced unload killed it: no restart
        self._stop = threading.Event()
        self._streak = 0  # quick deaths in a row
        self._writer = batches.BatchWriter()
        self._writer_child: ChildProcess | None = None
        self._tokens = itertools.count(1)
        self._late = LateResponses()  # batches whose model may still answer through responders
        self._children: list[ChildProcess] = []  # every child not yet reaped, for the GC safety net
        # Dropped without finalize (a model whose load failed half way): kill the children.
        self._finalizer = weakref.finalize(self, _kill_all, self._children)
        self._first = self._spawn()

    # --------------------------------------------------------------------------- lifecycle

    def wait_ready(self) -> None:
        """Wait for the first child to load the model; raises what its initialization raised."""
        child = self._first
        self._handshake(child)
        with self._cond:
            if not child.reaped:
                child.adopted = True
                self._child = child
                return
        child.wait_exit()
        raise InferenceError(
            Code.INTERNAL,
            f"model '{self.model}' instance '{self.name}' exited right after initialization "
            f"({exit_status(child.proc.returncode)})",
        )

    def _spawn(self) -> ChildProcess:
        batch, events = Ends(), Ends()
        life_r, life_w = os.pipe()
        passed = (*batch.child_fds, *events.child_fds, life_r)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "seqserve.engine.isolation.child", *map(str, passed)],
                pass_fds=passed,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,  # a terminal's Ctrl-C goes to the server, which stops them
            )
        except BaseException:
            batch.close()
            events.close()
            os.close(life_w)
            raise
        finally:
            os.close(life_r)
        batch.close_child_fds()
        events.close_child_fds()
        child = ChildProcess(proc, (batch, events), life_w, self._names)
        self._children.append(child)
        me = weakref.ref(self)
        threading.Thread(target=_reap, args=(me, child), name=f"{self.name}-reaper", daemon=True).start()
        threading.Thread(target=_serve_events, args=(me, child), name=f"{self.name}-events", daemon=True).start()
        with contextlib.suppress(ChannelClosed):  # it died at once: the handshake reports how
            child.batch.send(self._init)
        return child

    def _handshake(self, child: ChildProcess) -> None:
        try:
            body, _ = child.batch.recv()
        except ChannelClosed:
            child.retiring = True
            child.wait_exit()
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.model}' instance '{self.name}' exited during initialization "
                f"({exit_status(child.proc.returncode)})",
            ) from None
        kind = p.kind_of(body)
        if kind == p.READY and len(body) >= 2:
            child.uses_responders = bool(body[1])
            return
        child.retiring = True
        child.kill()
        if kind == p.INIT_FAILED:
            raise p.read_code_message(body)
        raise InferenceError(Code.INTERNAL, f"model '{self.model}' instance '{self.name}': unexpected message {kind}")

    def _exited(self, child: ChildProcess) -> None:
        """Reaper thread, once the child has exited: record, log, fail, restart."""
        status = exit_status(child.proc.returncode)
        restart = False
        delay = 0.0
        with self._cond:
            child.reaped = True
            what = child.killed_for or f"exited unexpectedly ({status})"
            if self._child is child:
                self._child = None
                restart = not self._closed and not self._aborted
            if restart:
                lived = time.monotonic() - child.started
                self._streak = 1 if lived >= QUICK_DEATH_S else self._streak + 1
                delay = backoff_delay(self._streak)
                self._starting = delay == 0
                self._retry_at = time.monotonic() + delay
            child.death = f"model '{self.model}' instance '{self.name}' {what}" + ("; restarting it" if restart else "")
            if restart:
                self._last_failure = child.death
            self._cond.notify_all()
        child.exited.set()
        if child.adopted and not child.retiring:
            if delay:
                log.error("%s in %.1f s", child.death, delay)
            else:
                log.error("%s", child.death)
        self._late.fail(child, InferenceError(Code.UNAVAILABLE, child.death))
        with contextlib.suppress(ValueError):
            self._children.remove(child)
        if restart:
            self._restart(delay)

    def _restart(self, delay: float) -> None:
        while True:
            if delay and self._stop.wait(delay):
                return
            with self._cond:
                if self._closed:
                    return
                self._starting = True
                self._cond.notify_all()
            child: ChildProcess | None = None
            try:
                child = self._spawn()
                self._handshake(child)
            except Exception as e:
                if child is not None:
                    child.retiring = True
                    child.kill()
                    child.wait_exit()
                    child.close_batch()
                self._streak += 1
                delay = max(backoff_delay(self._streak), BACKOFF_BASE_S)
                msg = f"model '{self.model}' instance '{self.name}' failed to restart: {e}"
                log.error("%s; next attempt in %.1f s", msg, delay)
                with self._cond:
                    self._starting = False
                    self._retry_at = time.monotonic() + delay
                    self._last_failure = msg
                    self._cond.notify_all()
                continue
            with self._cond:
                if not self._closed and not child.reaped:
                    child.adopted = True
                    child.started = time.monotonic()
                    self._child = child
                    self._starting = False
                    self._cond.notify_all()
                    log.warning("model '%s' instance '%s' restarted (pid %d)", self.model, self.name, child.pid)
                    self._restarts.increment()
                    return
                closed = self._closed
            if closed:
                self._retire(child)  # unloaded while it started
                child.close_batch()
                return
            self._streak += 1  # it died as soon as it was ready
            delay = max(backoff_delay(self._streak), BACKOFF_BASE_S)
            child.wait_exit()
            child.close_batch()
            with self._cond:
                self._starting = False
                self._retry_at = time.monotonic() + delay
                self._last_failure = f"model '{self.model}' instance '{self.name}' exited right after it restarted"

    def _wait_for_child(self) -> ChildProcess:
        deadline = time.monotonic() + RESTART_WAIT_S
        with self._cond:
            while True:
                if self._closed or self._aborted:
                    raise InferenceError(Code.UNAVAILABLE, f"model '{self.model}' instance '{self.name}' is unloading")
                child = self._child
                if child is not None:
                    return child
                remaining = deadline - time.monotonic()
                if self._starting and remaining > 0:
                    self._cond.wait(remaining)
                    continue
                wait = max(0.0, self._retry_at - time.monotonic())
                when = f"the next attempt is in {wait:.1f} s" if not self._starting else "it is still starting"
                raise InferenceError(
                    Code.UNAVAILABLE,
                    f"model '{self.model}' instance '{self.name}' is not available ({self._last_failure}); {when}",
                )

    def finalize(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            child = self._child
            self._child = None
            self._cond.notify_all()
        self._stop.set()
        message = ""
        if child is not None:
            message = self._retire(child, finalize=True)
        forget_source(self._metrics_source)
        self._release(child)
        if message:
            raise RuntimeError(f"finalize of model '{self.model}' instance '{self.name}' failed: {message}")

    def _release(self, child: ChildProcess | None) -> None:
        """Close what the instance holds once nothing uses it (idempotent)."""
        for used in {child, self._writer_child, self._first} - {None}:
            used.close_batch()  # type: ignore[union-attr]
        self._writer.close()
        self._late.clear()
        self._finalizer.detach()

    def _retire(self, child: ChildProcess, *, finalize: bool = False) -> str:
        """Stop a child on purpose: finalize (bounded) then exit, or kill."""
        child.retiring = True
        message = ""
        if finalize:
            try:
                child.batch.send(bytes((p.FINALIZE,)))
                body, _ = child.batch.recv(FINALIZE_TIMEOUT_S)
                if p.kind_of(body) == p.FINALIZED:
                    message = bytes(body[1:]).decode("utf-8", "replace")
            except TimeoutError:
                message = f"it did not finish within {FINALIZE_TIMEOUT_S:.0f} s and was killed"
            except (ChannelClosed, OSError, p.ProtocolError):
                pass
        else:
            child.kill()
        child.wait_exit()
        return message

    def abort(self) -> None:
        """An unload that a running execute outlasted (the engine does not finalize such an
        instance): kill the child and do not restart it. The executor thread left in
        ``execute`` returns at once and releases what the instance holds."""
        with self._cond:
            self._aborted = True
            child = self._child
            self._cond.notify_all()
        self._stop.set()
        if child is not None:
            child.killed_for = "was killed: its model was unloaded while it ran"
            child.kill()

    def kill(self) -> None:
        """Stop at once (a load that failed): no finalize."""
        with self._cond:
            self._closed = True
            child = self._child or self._first
            self._child = None
            self._cond.notify_all()
        self._stop.set()
        self._retire(child)
        child.close_batch()
        self._writer.close()
        self._finalizer.detach()

    # ----------------------------------------------------------------------------- execute

    def execute(self, batch: ExecuteBatch) -> Any:
        child, token, entry = self._send(batch)
        try:
            reply, rfds = child.batch.recv(self._timeout_s)
        except ChannelClosed:
            self._late.settle(token, entry, None)
            child.wait_exit()
            if self._aborted:  # left behind by the unload: nobody will finalize this instance
                self._release(child)
            raise InferenceError(Code.UNAVAILABLE, child.death) from None
        except TimeoutError:
            self._late.settle(token, entry, None)
            child.killed_for = f"did not finish execute within {round((self._timeout_s or 0) * 1000)} ms; it was killed"
            child.kill()
            child.wait_exit()
            raise InferenceError(Code.UNAVAILABLE, child.death) from None
        kind = reply[0] if len(reply) else -1
        if kind == p.RESULT:
            try:
                batched, outcomes = child.results.decode(reply, rfds)
            except p.ProtocolError as e:
                self._late.settle(token, entry, None)
                raise self._out_of_step(child, str(e)) from None
            if entry is not None:
                if outcomes is not None:
                    owed = {i for i, o in enumerate(outcomes) if o is DEFERRED}
                elif self._decoupled:
                    owed = set(range(len(batch.request_outputs)))
                else:
                    owed = set()
                wanted = batch.request_outputs
                self._late.settle(token, entry, {i for i in owed if i < len(wanted) and wanted[i] is not None})
            return batched if outcomes is None else RequestResults(outcomes, batched)
        self._late.settle(token, entry, None)
        if kind == p.FAILED:
            raise p.read_code_message(reply)
        raise self._out_of_step(child, f"unexpected message {kind}")

    def _send(self, batch: ExecuteBatch) -> tuple[ChildProcess, int, BatchResponders | None]:
        """Hand the batch to the serving child (waiting for one while it restarts)."""
        retried = False
        while True:
            child = self._child
            if child is None:
                child = self._wait_for_child()
            if self._writer_child is not child:
                if self._writer_child is not None:
                    self._writer_child.close_batch()  # the previous child, gone
                self._writer.reset()
                self._writer_child = child
            token = next(self._tokens)
            entry: BatchResponders | None = None
            if child.uses_responders and batch.responder is not None:
                entry = self._late.open(token, child, batch.responder)
            body, fds = self._writer.encode(batch, token)
            try:
                child.batch.send(body, fds)
                return child, token, entry
            except ChannelClosed:
                # Its end was closed before the batch went out: it died idle and never saw
                # this batch, which can run on the restarted child.
                self._late.settle(token, entry, None)
                child.wait_exit()
                if retried:
                    raise InferenceError(Code.UNAVAILABLE, child.death) from None
                retried = True

    def _out_of_step(self, child: ChildProcess, why: str) -> InferenceError:
        child.killed_for = f"sent a malformed reply ({why}); it was killed"
        child.kill()
        child.wait_exit()
        return InferenceError(Code.INTERNAL, child.death)

    # -------------------------------------------------------------------------- responders

    def _on_event(self, child: ChildProcess, body: memoryview, fds: list[int]) -> bytes:
        """A message on ``child``'s event channel (its event thread): a log line, or a late
        response or cancellation query; returns the answer."""
        if p.kind_of(body) == p.METRICS:
            receive_snapshot(body, self._metrics_source)
            return results.encode_ok()
        if p.kind_of(body) == p.LOG:
            level, name, text = results.decode_log(body)
            logging.getLogger(name).log(level, "%s", text, extra={"instance": self.name, "child_pid": child.pid})
            return results.encode_ok()
        kind, token, index, final, outcome = child.event_reader.decode(body, fds)
        return self._late.relay(child, kind, token, index, final, outcome)


def _reap(ref: weakref.ref[IsolatedInstance], child: ChildProcess) -> None:
    """A child's reaper thread: wait for its exit (holding no reference to the instance)."""
    child.proc.wait()
    child.exited_now()
    inst = ref()
    if inst is None:  # dropped without finalize (its children were killed)
        child.exited.set()
        return
    inst._exited(child)


def _serve_events(ref: weakref.ref[IsolatedInstance], child: ChildProcess) -> None:
    """A child's event thread: answer its responders' messages until it exits."""
    try:
        _relay_events(ref, child)
    finally:
        child.close_events()


def _relay_events(ref: weakref.ref[IsolatedInstance], child: ChildProcess) -> None:
    channel = child.events
    while True:
        try:
            body, fds = channel.recv()
        except (ChannelClosed, OSError):
            return
        inst = ref()
        if inst is None:
            return
        try:
            answer = inst._on_event(child, body, fds)
        except p.ProtocolError as e:
            log.error("model '%s' instance '%s' sent a malformed response (%s); killing it", inst.model, inst.name, e)
            child.killed_for = f"sent a malformed response ({e}); it was killed"
            child.kill()
            return
        except Exception as e:  # never let one response stop the relay
            log.exception("model '%s' instance '%s': relaying a response failed", inst.model, inst.name)
            answer = p.code_message(p.ERR, Code.INTERNAL, f"relaying the response failed: {type(e).__name__}: {e}")
        del inst
        try:
            channel.send(answer)
        except (ChannelClosed, OSError):
            return


def _kill_all(children: list[ChildProcess]) -> None:
    for child in list(children):
        child.retiring = True
        child.kill()


class IsolatedBackend(Backend):
    """Creates process-isolated instances of a model served by ``real`` (the python backend).
    The model's files are loaded in each child only, never in the server."""

    def gpu_unsupported_reason(self) -> str:
        return "process isolation does not run GPU instances yet (set parameter isolation: thread)"

    def __init__(self, ctx: ModelContext, real: type[Backend], *, execute_timeout_s: float | None = None) -> None:
        super().__init__(ctx)
        self._real = real
        self._timeout_s = execute_timeout_s
        self.instances: list[IsolatedInstance] = []

    def create_instance(self, ictx: InstanceContext) -> BackendInstance:
        inst = IsolatedInstance(ictx, execute_timeout_s=self._timeout_s)
        self.instances.append(inst)
        return inst

    def abort(self) -> None:
        """Kill every child (a forced unload held up by a running execute)."""
        for inst in self.instances:
            inst.abort()

    def wait_ready(self) -> None:
        """Every child has loaded the model (they start in parallel); on failure every one is
        stopped and the first error raised."""
        try:
            for inst in self.instances:
                inst.wait_ready()
        except BaseException:
            for inst in self.instances:
                inst.kill()
            raise

    def describe(self) -> dict[str, Any]:
        return {"backend": self._real.names[0] if self._real.names else self._real.__name__, "isolation": "process"}
