"""The Redis state store (``redis://host:port/db``): one hash per sequence, Lua scripts for
every change of hands (run with EVALSHA, so each is one atomic step on the server), a
heartbeat key per replica and a pub/sub channel per replica for handover requests.

Keys (``prefix`` default ``seqserve:``):

- ``{prefix}seq:{key}``: hash with ``owner``, ``token``, ``status``, ``session`` and, while
  released, ``data`` (the checkpoint). Its TTL is the entry's expiry.
- ``{prefix}hb:{replica}``: exists while the replica is alive (TTL ``heartbeat_ttl_s``).
- channel ``{prefix}handover:{replica}``: handover requests for that replica (the key's text).
- ``{prefix}epoch``: the store's epoch (a random name, no TTL); a Redis restarted empty lacks it.
- ``{prefix}lost``: hash with ``until`` and ``grace`` (ms, the server's clock): the loss window
  that ``recover`` marked (TTL: until it is over).

The claim script reads the owner's heartbeat key, which it is not handed in KEYS: fine on one
Redis server (or a primary with replicas), not on Redis Cluster (see docs/state-store.md).
redis-py is imported only when this store is used: ``pip install 'seqserve[redis]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from seqserve.engine.replicas.store.base import (
    Claim,
    Entry,
    HandoverHandler,
    SequenceKey,
    StateStore,
    Status,
    StoreError,
    StoreLostError,
    redact_url,
)
from seqserve.engine.replicas.tasks import stop_tasks

log = logging.getLogger("seqserve.statestore")

# ARGV: me, ttl_ms, session, epoch, epoch key, if_absent. -1: the store lost its data.
_REGISTER = """
if redis.call('GET', ARGV[5]) ~= ARGV[4] then return -1 end
if ARGV[6] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local tok = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'status', 'live', 'session', ARGV[3])
redis.call('HDEL', KEYS[1], 'data')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return tok
"""

# ARGV: me, ttl_ms, heartbeat key prefix, epoch, epoch key, loss key. {1, token, data|false, previous owner}
# when won; {0, in loss window, in its grace} when there is no entry; {2, owner, token, status, session} when
# someone else holds it; {3} when the store lost its data (not this replica's epoch).
_CLAIM = """
if redis.call('GET', ARGV[5]) ~= ARGV[4] then return {3} end
local e = redis.call('HMGET', KEYS[1], 'owner', 'token', 'status', 'session')
if not e[3] then
  local lost = redis.call('HMGET', ARGV[6], 'until', 'grace')
  if not lost[1] then return {0, 0, 0} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return {0, now < tonumber(lost[1]) and 1 or 0, now < tonumber(lost[2] or '0') and 1 or 0}
end
local st = e[3]
if st == 'released' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local untl = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
  if untl > 0 and now > untl then
    redis.call('HSET', KEYS[1], 'status', 'expired')
    redis.call('HDEL', KEYS[1], 'data', 'until')
    return {2, e[1], e[2], 'expired', e[4] or '0'}
  end
end
if st == 'released' or (st == 'live' and e[1] ~= ARGV[1] and redis.call('EXISTS', ARGV[3] .. e[1]) == 0) then
  local data = redis.call('HGET', KEYS[1], 'data')
  local tok = redis.call('HINCRBY', KEYS[1], 'token', 1)
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'status', 'live')
  redis.call('HDEL', KEYS[1], 'data', 'until')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tok, data, e[1]}
end
return {2, e[1], e[2], e[3], e[4] or '0'}
"""

# ARGV: me, token, data, ttl_ms, tombstone ttl_ms. 'until' (ms, the server's clock): when the
# checkpoint expires; the key lives on as a tombstone until the tombstone TTL is over too.
_RELEASE = """
local e = redis.call('HMGET', KEYS[1], 'owner', 'token', 'status')
if e[1] ~= ARGV[1] or e[2] ~= ARGV[2] or e[3] ~= 'live' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'status', 'released', 'data', ARGV[3], 'until', now + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
return 1
"""

# ARGV: me, token, tombstone ttl_ms (0: delete)
_END = """
local e = redis.call('HMGET', KEYS[1], 'owner', 'token')
if e[1] ~= ARGV[1] or e[2] ~= ARGV[2] then return 0 end
if ARGV[3] == '0' then redis.call('DEL', KEYS[1]) return 1 end
redis.call('HSET', KEYS[1], 'status', 'ended')
redis.call('HDEL', KEYS[1], 'data', 'until')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# ARGV: me, token, ttl_ms
_REFRESH = """
local e = redis.call('HMGET', KEYS[1], 'owner', 'token', 'status')
if e[1] ~= ARGV[1] or e[2] ~= ARGV[2] or e[3] ~= 'live' then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


# KEYS: epoch, loss. ARGV: a new epoch, the caller's old one, window ms, grace ms. Answers the epoch.
_RECOVER = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1])
  cur = ARGV[1]
end
if cur ~= ARGV[2] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lost = redis.call('HMGET', KEYS[2], 'until', 'grace')
  local u = math.max(tonumber(lost[1] or '0'), now + tonumber(ARGV[3]))
  local g = math.max(tonumber(lost[2] or '0'), now + tonumber(ARGV[4]))
  redis.call('HSET', KEYS[2], 'until', u, 'grace', g)
  redis.call('PEXPIRE', KEYS[2], math.max(u, g) - now + 1)
end
return cur
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisStore(StateStore):
    """See the module's docstring."""

    def __init__(self, url: str, replica_id: str, *, heartbeat_ttl_s: float = 10.0, prefix: str = "seqserve:") -> None:
        super().__init__(replica_id, heartbeat_ttl_s=heartbeat_ttl_s)
        try:
            import redis.asyncio as aioredis
        except ImportError:
            raise StoreError(
                "the redis:// state store needs redis-py: pip install 'seqserve[redis]' (or pip install redis)"
            ) from None
        self._redis_errors: tuple[type[BaseException], ...] = (aioredis.RedisError, OSError)
        self.url = redact_url(url)  # for messages: never the password
        self.prefix = prefix
        # bounded waits: a store that hangs must not hang the requests that consult it
        self._r = aioredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._register = self._r.register_script(_REGISTER)
        self._claim = self._r.register_script(_CLAIM)
        self._release = self._r.register_script(_RELEASE)
        self._end = self._r.register_script(_END)
        self._refresh = self._r.register_script(_REFRESH)
        self._recover = self._r.register_script(_RECOVER)
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        self._handler_tasks: set[asyncio.Task[None]] = set()

    def _k(self, key: SequenceKey) -> str:
        return f"{self.prefix}seq:{key.encode()}"

    def _hb(self, replica: str) -> str:
        return f"{self.prefix}hb:{replica}"

    def _channel(self, replica: str) -> str:
        return f"{self.prefix}handover:{replica}"

    @property
    def _epoch_key(self) -> str:
        return f"{self.prefix}epoch"

    @property
    def _lost_key(self) -> str:
        return f"{self.prefix}lost"

    async def _do(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except self._redis_errors as e:
            raise StoreError(f"state store {self.url}: {what} failed: {e}") from None

    async def open(self, on_handover: HandoverHandler | None = None) -> None:
        fresh = secrets.token_hex(8)
        self.created_epoch = bool(await self._do("open", self._r.set(self._epoch_key, fresh, nx=True)))
        self.epoch = _text(await self._do("open", self._r.get(self._epoch_key)) or b"")
        await self.heartbeat()
        if on_handover is not None:
            self._pubsub = self._r.pubsub(ignore_subscribe_messages=True)
            await self._do("subscribe", self._pubsub.subscribe(self._channel(self.replica_id)))
            self._listener = asyncio.create_task(self._listen(on_handover), name="seqserve-statestore-handover")

    async def _listen(self, on_handover: HandoverHandler) -> None:
        while True:
            try:
                msg = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a dropped connection: redis-py reconnects on the next call
                log.warning("state store: handover channel: %s", e)
                await asyncio.sleep(0.5)
                continue
            if msg is None or msg.get("type") != "message":
                continue
            try:
                requester, text = _text(msg["data"]).split(" ", 1)
                key = SequenceKey.decode(text)
            except ValueError:
                log.warning("state store: ignoring a malformed handover request %r", msg["data"][:200])
                continue
            task = asyncio.create_task(on_handover(key, requester))
            self._handler_tasks.add(task)
            task.add_done_callback(self._handler_tasks.discard)

    async def close(self) -> None:
        if self._listener is not None:
            await stop_tasks([self._listener])
            self._listener = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
        with contextlib.suppress(Exception):
            await self._r.delete(self._hb(self.replica_id))
        await self._r.aclose()

    async def heartbeat(self) -> bool:
        pipe = self._r.pipeline(transaction=False)
        pipe.set(self._hb(self.replica_id), b"1", px=_ms(self.heartbeat_ttl_s))
        pipe.get(self._epoch_key)
        _, epoch = await self._do("heartbeat", pipe.execute())
        return epoch is not None and _text(epoch) == self.epoch

    async def recover(self, window_s: float, grace_s: float) -> None:
        keys = [self._epoch_key, self._lost_key]
        args: list[str | int] = [secrets.token_hex(8), self.epoch, _ms(window_s), _ms(grace_s)]
        self.epoch = _text(await self._do("recover", self._recover(keys=keys, args=args)))

    async def is_alive(self, replica_id: str) -> bool:
        return bool(await self._do("heartbeat check", self._r.exists(self._hb(replica_id))))

    async def get(self, key: SequenceKey) -> Entry | None:
        owner, token, status, session, data, until = await self._do(
            "get", self._r.hmget(self._k(key), ["owner", "token", "status", "session", "data", "until"])
        )
        if status is None:
            return None
        st = Status(_text(status))
        if st is Status.RELEASED and until is not None and int(until) < time.time() * 1000:
            st, data = Status.EXPIRED, None  # (a claim makes it so in the store)
        return Entry(_text(owner or b""), int(token or 0), st, _text(session) == "1", data)

    async def register(
        self, keys: list[tuple[SequenceKey, bool]], ttl_s: float, *, if_absent: bool = False
    ) -> list[int]:
        if not keys:
            return []
        calls = []
        for key, session in keys:
            args: list[str | int] = [self.replica_id, _ms(ttl_s), int(session), self.epoch, self._epoch_key]
            args.append(int(if_absent))
            calls.append(([self._k(key)], args))
        if len(calls) == 1:  # one round trip (a pipeline checks its scripts first: two)
            tokens = [int(await self._do("register", self._register(keys=calls[0][0], args=calls[0][1])))]
        else:
            pipe = self._r.pipeline(transaction=False)
            for k, args in calls:
                await self._register(keys=k, args=args, client=pipe)
            tokens = [int(t) for t in await self._do("register", pipe.execute())]
        if -1 in tokens:
            raise StoreLostError(f"state store {self.url} lost its data (it restarted empty?)")
        return tokens

    async def claim(self, key: SequenceKey, ttl_s: float) -> Claim:
        args: list[str | int] = [self.replica_id, _ms(ttl_s), self.prefix + "hb:", self.epoch]
        args += [self._epoch_key, self._lost_key]
        r = await self._do("claim", self._claim(keys=[self._k(key)], args=args))
        if r[0] == 3:
            raise StoreLostError(f"state store {self.url} lost its data (it restarted empty?)")
        if r[0] == 0:
            return Claim(False, in_loss_window=bool(r[1]), in_loss_grace=bool(r[2]))
        if r[0] == 1:
            return Claim(True, int(r[1]), r[2] or None, previous_owner=_text(r[3]))
        return Claim(False, entry=Entry(_text(r[1]), int(r[2]), Status(_text(r[3])), _text(r[4]) == "1"))

    async def release(
        self, key: SequenceKey, token: int, data: bytes, ttl_s: float, tombstone_ttl_s: float = 0.0
    ) -> bool:
        tomb = _ms(tombstone_ttl_s) if tombstone_ttl_s > 0 else 0
        r = await self._do(
            "release",
            self._release(keys=[self._k(key)], args=[self.replica_id, token, data, _ms(ttl_s), tomb]),
        )
        return bool(r)

    async def _batched(self, what: str, script: Any, items: list[tuple[SequenceKey, int]], ttl_s: float) -> list[bool]:
        if not items:
            return []
        ttl = _ms(ttl_s) if ttl_s > 0 else 0
        pipe = self._r.pipeline(transaction=False)
        for key, token in items:
            await script(keys=[self._k(key)], args=[self.replica_id, token, ttl], client=pipe)
        return [bool(x) for x in await self._do(what, pipe.execute())]

    async def end(self, items: list[tuple[SequenceKey, int]], tombstone_ttl_s: float) -> list[bool]:
        return await self._batched("end", self._end, items, tombstone_ttl_s)

    async def refresh(self, items: list[tuple[SequenceKey, int]], ttl_s: float) -> list[bool]:
        return await self._batched("refresh", self._refresh, items, ttl_s)

    async def request_handover(self, owner: str, key: SequenceKey) -> None:
        await self._do("handover request", self._r.publish(self._channel(owner), f"{self.replica_id} {key.encode()}"))
