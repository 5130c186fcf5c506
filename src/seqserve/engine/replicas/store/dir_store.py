"""The directory state store (``dir:///path``), for replicas on one host (or a shared
filesystem with working ``flock``): one file per sequence, replaced atomically (a temporary
file, fsync'd, then renamed over it), every change of hands under an exclusive ``flock`` on the
model version's lock file, so a read-check-write is one atomic step for every process.

Layout under the root:

- ``seq/<model>/<version>/<u|s><id>.entry``: a JSON line (owner, token, status, session,
  expires: wall-clock seconds) and then the checkpoint bytes, while released.
- ``seq/<model>/<version>/.lock``: the lock file.
- ``hb/<replica>``: the replica's heartbeat: its expiry time, rewritten every beat.
- ``handover/<replica>/<n>.req``: handover requests, each a file the owner picks up (it polls
  every ``poll_s``, 50 ms by default) and deletes.
- ``epoch``: the store's epoch (a wiped directory lacks it); ``lost``: the loss window that
  ``recover`` marked (JSON: ``until`` and ``grace``, wall-clock seconds); ``.lock``: their lock.

File I/O runs in worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

from seqserve.engine.replicas.store.base import (
    Claim,
    Entry,
    HandoverHandler,
    SequenceKey,
    StateStore,
    Status,
    StoreError,
    StoreLostError,
)
from seqserve.engine.replicas.tasks import stop_tasks

log = logging.getLogger("seqserve.statestore")

#: a file name longer than this is replaced by its hash (file systems cap names at 255 bytes)
_MAX_NAME = 180


def _name(text: str) -> str:
    q = urllib.parse.quote(text, safe="")
    return q if len(q) <= _MAX_NAME else "h" + hashlib.sha256(text.encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DirStore(StateStore):
    """See the module's docstring."""

    def __init__(
        self, root: str | Path, replica_id: str, *, heartbeat_ttl_s: float = 10.0, poll_s: float = 0.05
    ) -> None:
        super().__init__(replica_id, heartbeat_ttl_s=heartbeat_ttl_s)
        self.root = Path(root)
        self.poll_s = poll_s
        self._poller: asyncio.Task[None] | None = None
        self._handler_tasks: set[asyncio.Task[None]] = set()

    # paths and locking ---------------------------------------------------------------------
    def _dir(self, key: SequenceKey) -> Path:
        return self.root / "seq" / _name(key.model) / str(key.version)

    def _path(self, key: SequenceKey) -> Path:
        kind = "u" if isinstance(key.sequence_id, int) else "s"
        return self._dir(key) / f"{kind}{_name(str(key.sequence_id))}.entry"

    def _hb(self, replica: str) -> Path:
        return self.root / "hb" / _name(replica)

    def _inbox(self, replica: str) -> Path:
        return self.root / "handover" / _name(replica)

    @contextlib.contextmanager
    def _locked(self, key: SequenceKey) -> Iterator[None]:
        d = self._dir(key)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the lock

    def _read(self, key: SequenceKey) -> tuple[dict[str, object], bytes] | None:
        """The entry's header and data; None when absent or expired (an expired one is removed:
        callers hold the lock)."""
        try:
            raw = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        head, _, data = raw.partition(b"\n")
        meta = json.loads(head)
        now = time.time()
        if float(meta["expires"]) < now:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()
            return None
        until = meta.get("until")
        if meta["status"] == Status.RELEASED.value and until is not None and float(until) < now:
            # the checkpoint expired; the entry stays a tombstone until "expires"
            meta = {**meta, "status": Status.EXPIRED.value}
            meta.pop("until")
            self._write(key, meta)
            data = b""
        return meta, data

    def _write(self, key: SequenceKey, meta: dict[str, object], data: bytes = b"") -> None:
        _atomic_write(self._path(key), json.dumps(meta).encode() + b"\n" + data)

    async def _run(self, what: str, fn: object, *args: object) -> object:
        try:
            return await asyncio.to_thread(fn, *args)  # type: ignore[arg-type]
        except OSError as e:
            raise StoreError(f"state store {self.root}: {what} failed: {e}") from None

    # epoch and loss window ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _root_locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_epoch(self) -> str:
        try:
            return (self.root / "epoch").read_text()
        except FileNotFoundError:
            return ""

    def _check_epoch(self) -> None:
        if self._read_epoch() != self.epoch:
            raise StoreLostError(f"state store {self.root} lost its data (the directory was wiped?)")

    def _loss(self) -> tuple[float, float]:
        try:
            doc = json.loads((self.root / "lost").read_text())
            return float(doc["until"]), float(doc["grace"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return 0.0, 0.0

    def _adopt_epoch(self, old: str, window_s: float, grace_s: float) -> tuple[str, bool]:
        """The store's epoch (written when absent) and whether this call wrote it; with
        ``old`` not the current one, the loss window is marked (as ``recover`` says)."""
        with self._root_locked():
            cur = self._read_epoch()
            created = not cur
            if created:
                cur = secrets.token_hex(8)
                _atomic_write(self.root / "epoch", cur.encode())
            if old and cur != old:
                now = time.time()
                until, grace = self._loss()
                doc = {"until": max(until, now + window_s), "grace": max(grace, now + grace_s)}
                _atomic_write(self.root / "lost", json.dumps(doc).encode())
            return cur, created

    # lifecycle ---------------------------------------------------------------------------------
    async def open(self, on_handover: HandoverHandler | None = None) -> None:
        await self._run("open", self._inbox(self.replica_id).mkdir, 0o700, True, True)
        self.epoch, self.created_epoch = await self._run("open", self._adopt_epoch, "", 0.0, 0.0)  # type: ignore[misc]
        await self.heartbeat()
        if on_handover is not None:
            self._poller = asyncio.create_task(self._poll(on_handover), name="seqserve-statestore-handover")

    async def _poll(self, on_handover: HandoverHandler) -> None:
        inbox = self._inbox(self.replica_id)
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                requests = await asyncio.to_thread(self._take_requests, inbox)
            except OSError as e:
                log.warning("state store: handover inbox %s: %s", inbox, e)
                continue
            for requester, key in requests:
                task = asyncio.create_task(on_handover(key, requester))
                self._handler_tasks.add(task)
                task.add_done_callback(self._handler_tasks.discard)

    @staticmethod
    def _take_requests(inbox: Path) -> list[tuple[str, SequenceKey]]:
        out = []
        with os.scandir(inbox) as it:
            names = [e.name for e in it if e.name.endswith(".req")]
        for name in sorted(names):
            p = inbox / name
            try:
                text = p.read_text()
                p.unlink()
            except FileNotFoundError:
                continue
            try:
                requester, key = text.split(" ", 1)
                out.append((requester, SequenceKey.decode(key)))
            except ValueError:
                log.warning("state store: ignoring a malformed handover request %r", text[:200])
        return out

    async def close(self) -> None:
        if self._poller is not None:
            await stop_tasks([self._poller])
            self._poller = None
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self._hb(self.replica_id).unlink, True)

    async def heartbeat(self) -> bool:
        p = self._hb(self.replica_id)

        def beat() -> bool:
            p.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(p, str(time.time() + self.heartbeat_ttl_s).encode())
            return self._read_epoch() == self.epoch

        return bool(await self._run("heartbeat", beat))

    async def recover(self, window_s: float, grace_s: float) -> None:
        self.epoch, _ = await self._run("recover", self._adopt_epoch, self.epoch, window_s, grace_s)  # type: ignore[misc]

    def _alive(self, replica: str) -> bool:
        try:
            return float(self._hb(replica).read_text()) >= time.time()
        except (FileNotFoundError, ValueError):
            return False

    async def is_alive(self, replica_id: str) -> bool:
        return bool(await self._run("heartbeat check", self._alive, replica_id))

    # entries -------------------------------------------------------------------------------------
    @staticmethod
    def _entry(meta: dict[str, object], data: bytes) -> Entry:
        status = Status(str(meta["status"]))
        return Entry(
            str(meta["owner"]),
            int(meta["token"]),  # type: ignore[call-overload]
            status,
            bool(meta["session"]),
            data if status is Status.RELEASED else None,
        )

    async def get(self, key: SequenceKey) -> Entry | None:
        def get() -> Entry | None:
            with self._locked(key):
                found = self._read(key)
            return None if found is None else self._entry(*found)

        return await self._run("get", get)  # type: ignore[return-value]

    def _meta(
        self, token: int, status: Status, session: bool, ttl_s: float, until_s: float | None = None
    ) -> dict[str, object]:
        now = time.time()
        meta: dict[str, object] = {
            "owner": self.replica_id,
            "token": token,
            "status": status.value,
            "session": session,
            "expires": now + ttl_s,
        }
        if until_s is not None:
            meta["until"] = now + until_s
        return meta

    async def register(
        self, keys: list[tuple[SequenceKey, bool]], ttl_s: float, *, if_absent: bool = False
    ) -> list[int]:
        def register() -> list[int]:
            self._check_epoch()
            tokens = []
            for key, session in keys:
                with self._locked(key):
                    found = self._read(key)
                    if if_absent and found is not None:
                        tokens.append(0)
                        continue
                    token = (int(found[0]["token"]) if found else 0) + 1  # type: ignore[call-overload]
                    self._write(key, self._meta(token, Status.LIVE, session, ttl_s))
                tokens.append(token)
            return tokens

        return await self._run("register", register)  # type: ignore[return-value]

    async def claim(self, key: SequenceKey, ttl_s: float) -> Claim:
        def claim() -> Claim:
            self._check_epoch()
            with self._locked(key):
                found = self._read(key)
                if found is None:
                    until, grace = self._loss()
                    now = time.time()
                    return Claim(False, in_loss_window=now < until, in_loss_grace=now < grace)
                entry = self._entry(*found)
                ours = entry.owner == self.replica_id
                if entry.status is Status.RELEASED or (
                    entry.status is Status.LIVE and not ours and not self._alive(entry.owner)
                ):
                    token = entry.token + 1
                    self._write(key, self._meta(token, Status.LIVE, entry.session, ttl_s))
                    return Claim(True, token, entry.data, previous_owner=entry.owner)
                return Claim(False, entry=Entry(entry.owner, entry.token, entry.status, entry.session))

        return await self._run("claim", claim)  # type: ignore[return-value]

    def _if_current(self, key: SequenceKey, token: int, live: bool = True) -> dict[str, object] | None:
        found = self._read(key)
        if found is None:
            return None
        meta = found[0]
        if meta["owner"] != self.replica_id or int(meta["token"]) != token:  # type: ignore[call-overload]
            return None
        if live and meta["status"] != Status.LIVE.value:
            return None
        return meta

    async def release(
        self, key: SequenceKey, token: int, data: bytes, ttl_s: float, tombstone_ttl_s: float = 0.0
    ) -> bool:
        def release() -> bool:
            with self._locked(key):
                meta = self._if_current(key, token)
                if meta is None:
                    return False
                session = bool(meta["session"])
                new = self._meta(token, Status.RELEASED, session, ttl_s + max(tombstone_ttl_s, 0.0), until_s=ttl_s)
                self._write(key, new, data)
                return True

        return bool(await self._run("release", release))

    async def end(self, items: list[tuple[SequenceKey, int]], tombstone_ttl_s: float) -> list[bool]:
        def end() -> list[bool]:
            out = []
            for key, token in items:
                with self._locked(key):
                    meta = self._if_current(key, token, live=False)
                    if meta is not None:
                        if tombstone_ttl_s > 0:
                            self._write(key, self._meta(token, Status.ENDED, bool(meta["session"]), tombstone_ttl_s))
                        else:
                            self._path(key).unlink()
                out.append(meta is not None)
            return out

        return await self._run("end", end)  # type: ignore[return-value]

    async def refresh(self, items: list[tuple[SequenceKey, int]], ttl_s: float) -> list[bool]:
        def refresh() -> list[bool]:
            out = []
            for key, token in items:
                with self._locked(key):
                    meta = self._if_current(key, token)
                    if meta is not None:
                        self._write(key, self._meta(token, Status.LIVE, bool(meta["session"]), ttl_s))
                out.append(meta is not None)
            return out

        return await self._run("refresh", refresh)  # type: ignore[return-value]

    async def request_handover(self, owner: str, key: SequenceKey) -> None:
        def put() -> None:
            inbox = self._inbox(owner)
            inbox.mkdir(parents=True, exist_ok=True)
            _atomic_write(
                inbox / f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.req", f"{self.replica_id} {key.encode()}".encode()
            )

        await self._run("handover request", put)
