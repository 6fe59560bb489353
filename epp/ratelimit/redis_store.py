"""Limit state shared by every replica, in Redis: the same `run(ops, mode)` as `LocalStore`, in one Lua script.

- One round trip per call: EVALSHA of the script (SHA1 computed here), falling back to EVAL when the server does
  not know it yet (NOSCRIPT: first use, a restarted or flushed server), which also caches it.
- The script reads every key, decides all or nothing, then writes: atomic on the server, so replicas never
  overdraw each other. Time is the server's (`TIME`), so replica clocks never matter; tests may pass a clock.
- Keys are `<prefix>:<kind>:<limit name>:<metric>|<scope hash>`. The default prefix `pointsman:{rl}` carries a
  Redis Cluster hash tag, so every key of a call lives in one slot. Every key has a TTL: a bucket expires when it
  would be full again, a window one slot after its newest usage has left it.
- Bounded time: a call is cancelled after `timeout_s` (the pool's connect and socket timeouts are the backstop)
  and raises `StoreUnavailable`; the limiter then applies its Redis-down policy. A cancelled call may still
  have run on the server (it was sent but the answer was late): such a charge can count twice, once in Redis
  and once in the fallback. Calls are never retried here: the request path does not wait twice.
- The URL's password never appears in messages: `address` is the redacted form.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from epp.ratelimit.limits import Algorithm
from epp.ratelimit.state import INF, Mode, Op, OpResult, StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "pointsman:{rl}"

SCRIPT = """
-- Pointsman rate limits: check and charge token buckets and rolling windows, all or nothing.
-- ARGV[1] now in seconds (<= 0: the server's TIME); ARGV[2] mode: a(dmit) c(harge) p(eek: decide, write nothing);
-- ARGV[3] '1' when the last key is a batch id: a call whose id was seen before charges nothing (an idempotent
-- retry of a settle batch that timed out); then 7 values per key: kind (b|w), amount, rate per second (b) or
-- slot width in seconds (w), slots (w), need, charge, slot to give a negative charge back to (-1: none).
-- Reply: {ok, then per key: remaining, retry_after (-1: never), reset_after, charged slot (-1: none)}.
local function num(x) return string.format('%.17g', x) end
local now = tonumber(ARGV[1])
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local mode = ARGV[2]
local n = #KEYS
if ARGV[3] == '1' then
  n = n - 1
  if not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'EX', 3600) then mode = 'p' end
end
local ok = 1
local cur, win, out = {}, {}, {}
for i = 1, n do
  local b = 3 + (i - 1) * 7
  local kind, amount = ARGV[b + 1], tonumber(ARGV[b + 2])
  local p, nslots, need = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local tol = 1e-9 * amount
  local retry, remaining, reset = 0, 0, 0
  if kind == 'b' then
    local v = redis.call('HMGET', KEYS[i], 'l', 't')
    local level = tonumber(v[1])
    if level == nil then
      level = amount
    else
      local ts = tonumber(v[2]) or now
      if now > ts then level = level + (now - ts) * p end
      if level > amount then level = amount end
    end
    cur[i] = level
    remaining = level
    reset = (amount - level) / p
    if mode ~= 'c' and level < need - tol then
      ok = 0
      if need > amount then retry = -1 else retry = (need - level) / p end
    end
  else
    local oldest = math.floor(now / p) - nslots
    local flat = redis.call('HGETALL', KEYS[i])
    local slots, stale, used = {}, {}, 0
    for j = 1, #flat, 2 do
      local idx = tonumber(flat[j])
      if idx == nil or idx < oldest then
        stale[#stale + 1] = flat[j]
      else
        local a = tonumber(flat[j + 1]) or 0
        used = used + a
        slots[#slots + 1] = {idx, a}
      end
    end
    if #stale > 0 and mode ~= 'p' then redis.call('HDEL', KEYS[i], unpack(stale)) end
    table.sort(slots, function(x, y) return x[1] < y[1] end)
    win[i] = slots
    cur[i] = used
    remaining = amount - used
    if #slots > 0 then reset = math.max(0, (slots[#slots][1] + nslots + 1) * p - now) end
    if mode ~= 'c' and remaining < need - tol then
      ok = 0
      if need > amount then
        retry = -1
      else
        local r = remaining
        for j = 1, #slots do
          r = r + slots[j][2]
          if r >= need - tol then
            retry = math.max(0, (slots[j][1] + nslots + 1) * p - now)
            break
          end
        end
      end
    end
  end
  out[i] = {remaining, retry, reset, -1}
end
if ok == 1 and mode ~= 'p' then
  for i = 1, n do
    local b = 3 + (i - 1) * 7
    local kind, amount = ARGV[b + 1], tonumber(ARGV[b + 2])
    local p, nslots = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    local charge, slot = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
    if kind == 'b' then
      local level = cur[i] - charge
      if level > amount then level = amount end
      if level >= amount then
        redis.call('DEL', KEYS[i])
      else
        redis.call('HSET', KEYS[i], 'l', num(level), 't', num(now))
        redis.call('PEXPIRE', KEYS[i], math.ceil((amount - level) / p * 1000) + 1000)
      end
      out[i][1] = level
      out[i][3] = (amount - level) / p
    elseif charge ~= 0 then
      local idx_now = math.floor(now / p)
      local used = cur[i]
      local gone = nil
      if charge > 0 or slot < 0 then
        redis.call('HINCRBYFLOAT', KEYS[i], num(idx_now), num(charge))
        used = used + charge
        out[i][4] = idx_now
      elseif slot >= idx_now - nslots then
        local field = num(slot)
        local v = tonumber(redis.call('HGET', KEYS[i], field))
        if v ~= nil then
          local back = math.min(-charge, v)
          if v - back <= 0 then
            redis.call('HDEL', KEYS[i], field)
            gone = slot
          else
            redis.call('HSET', KEYS[i], field, num(v - back))
          end
          used = used - back
        end
      end
      local newest = -1
      if out[i][4] >= 0 then newest = out[i][4] end
      local slots = win[i]
      for j = #slots, 1, -1 do
        if slots[j][1] ~= gone then
          if slots[j][1] > newest then newest = slots[j][1] end
          break
        end
      end
      if redis.call('EXISTS', KEYS[i]) == 1 then
        redis.call('PEXPIRE', KEYS[i], math.ceil((nslots + 2) * p * 1000))
      end
      out[i][1] = amount - used
      if newest >= 0 then out[i][3] = math.max(0, (newest + nslots + 1) * p - now) else out[i][3] = 0 end
    end
  end
end
local reply = {ok}
for i = 1, n do
  reply[#reply + 1] = num(out[i][1])
  reply[#reply + 1] = num(out[i][2])
  reply[#reply + 1] = num(out[i][3])
  reply[#reply + 1] = out[i][4]
end
return reply
"""

SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


def redact(url: str) -> str:
    """redis://user:secret@host:6379/0 -> redis://host:6379/0 (never show credentials)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        path = parts.path if parts.path not in ("", "/") else ""
        return f"{parts.scheme}://{host}{port}{path}" if parts.scheme else "redis"
    except ValueError:
        return "redis (unparsable address)"


def normalize_url(address: str) -> str:
    """Accept 'host:port' (Kthena's RedisConfig.address) as well as redis:// / rediss:// / unix:// URLs."""
    a = address.strip()
    if "://" in a:
        return a
    if not a:
        raise ValueError("redis address: empty")
    return f"redis://{a}"


T = TypeVar("T")

if sys.version_info >= (3, 11):
    async def _bounded(coro: Awaitable[T], timeout_s: float) -> T:
        async with asyncio.timeout(timeout_s):
            return await coro
else:  # pragma: no cover - Python 3.10
    async def _bounded(coro: Awaitable[T], timeout_s: float) -> T:
        return await asyncio.wait_for(coro, timeout_s)


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.03,
        key_prefix: str = DEFAULT_PREFIX,
        max_connections: int = 64,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"redis timeout must be > 0 seconds, got {timeout_s!r}")
        self.url = normalize_url(url)
        self.address = redact(self.url)
        self.timeout_s = timeout_s
        self.prefix = key_prefix
        self.clock = clock  # None: the Redis server's TIME
        self.calls = 0
        self.last_duration_s = 0.0
        pool = BlockingConnectionPool.from_url(
            self.url,
            max_connections=max_connections,
            timeout=None,  # waiting for a connection is bounded by the call's own timeout
            socket_timeout=max(timeout_s * 4, 0.25),
            socket_connect_timeout=max(timeout_s * 4, 0.25),
        )
        self._client = Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0), decode_responses=False)

    def key(self, op_key: str) -> str:
        return f"{self.prefix}:{op_key}"

    async def run(self, ops: Sequence[Op], mode: Mode, *, batch_id: str = "") -> tuple[bool, list[OpResult]]:
        """Run one call. With `batch_id`, the call charges at most once however often it is sent (its id is kept
        an hour): the limiter resends a settle batch that timed out with the same id."""
        if not ops:
            return True, []
        keys = [self.key(op.key) for op in ops]
        now = self.clock() if self.clock is not None else 0.0
        args: list[str | float | int] = [repr(float(now)), mode.value, "1" if batch_id else "0"]
        for op in ops:
            lim = op.limit
            if lim.algorithm is Algorithm.TOKEN_BUCKET:
                args += ["b", repr(float(lim.amount)), repr(lim.rate), 0]
            else:
                args += ["w", repr(float(lim.amount)), repr(lim.width), lim.nslots]
            args += [repr(float(op.need)), repr(float(op.charge)), int(op.slot)]
        if batch_id:
            keys.append(f"{self.prefix}:batch:{batch_id}")
        t0 = time.perf_counter()
        try:
            reply = await _bounded(self._eval(keys, args), self.timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise StoreUnavailable("timeout", f"redis at {self.address} did not answer within "
                                              f"{self.timeout_s * 1000:g} ms") from None
        except RedisError as exc:
            raise StoreUnavailable("error", f"redis at {self.address} failed: {type(exc).__name__}") from None
        except OSError as exc:
            raise StoreUnavailable("error", f"redis at {self.address} failed: {type(exc).__name__}") from None
        finally:
            self.last_duration_s = time.perf_counter() - t0
            self.calls += 1
        return self._parse(reply, len(ops))

    async def _eval(self, keys: list[str], args: list[str | float | int]) -> object:
        try:
            return await self._client.evalsha(SCRIPT_SHA, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(SCRIPT, len(keys), *keys, *args)

    @staticmethod
    def _parse(reply: object, n: int) -> tuple[bool, list[OpResult]]:
        if not isinstance(reply, list) or len(reply) != 1 + 4 * n:
            raise StoreUnavailable("error", "redis returned an unexpected reply to the rate-limit script")
        out: list[OpResult] = []
        for i in range(n):
            base = 1 + 4 * i
            retry = float(reply[base + 1])
            out.append(OpResult(float(reply[base]), INF if retry < 0 else retry, float(reply[base + 2]),
                                int(reply[base + 3])))
        return bool(int(reply[0])), out

    async def ping(self, timeout_s: float | None = None) -> bool:
        """Whether the server answers, by loading the script (SCRIPT LOAD): at start-up this also opens a pooled
        connection and spares the first admissions a NOSCRIPT round trip."""
        try:
            await _bounded(self._client.script_load(SCRIPT), timeout_s or self.timeout_s)
            return True
        except (TimeoutError, asyncio.TimeoutError, RedisError, OSError):
            return False

    async def close(self) -> None:
        try:
            await self._client.aclose()
            await self._client.connection_pool.disconnect()
        except (RedisError, OSError):
            pass
