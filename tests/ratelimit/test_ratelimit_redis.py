"""Shared limits on a real redis-server (Debian's, started here on an OS-chosen port): the Lua script against the
local store, script loading, TTLs, two processes sharing a budget, Redis dying, hanging and coming back, and
credentials that never show."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync
from prometheus_client import generate_latest

from epp.ratelimit import Limit, Limiter, Price, RateLimitMetrics, RedisStore, redact
from epp.ratelimit.redis_store import SCRIPT_SHA, normalize_url
from epp.ratelimit.state import LocalStore, Mode, Op
from tests.support.redis_server import RedisServer
from tests.support.wait import until

pytestmark = pytest.mark.realtime  # wall-clock bounds: run alone on a quiet machine (scripts/test.sh)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server this test may kill, pause and restart."""
    srv = RedisServer().start()
    yield srv
    srv.stop()


class Clock:
    def __init__(self, t: float = 10_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fallbacks(metrics: RateLimitMetrics) -> float:
    total = 0.0
    for fam in metrics.registry.collect():
        if fam.name == "pointsman_ratelimit_redis_fallback":
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


def answers(sync: redis_sync.Redis) -> bool:
    try:
        return bool(sync.ping())
    except redis_sync.RedisError:
        return False


# ---- the script is the local store, on the server --------------------------------------------------------------
def test_lua_script_decides_exactly_like_the_local_store(shared_redis: RedisServer) -> None:
    """The same random calls (admit, charge, refund to a slot, peek) on buckets and windows, with one injected
    clock, give the same decisions, remaining amounts, retry and reset times from Redis and from the process."""

    async def main() -> None:
        clock = Clock()
        store = RedisStore(shared_redis.url, clock=clock, timeout_s=2.0, key_prefix="parity")
        local = LocalStore()
        rng = random.Random(11)
        limits = [Limit.per_unit("b1", "input_tokens", 500, "minute"),
                  Limit.per_unit("b2", "output_tokens", 50, "second"),
                  Limit.rolling("w1", "total_tokens", 2000, 90),
                  Limit.rolling("w2", "usd", 0.05, 7, slots=7)]
        slots: dict[str, list[int]] = {}
        for step in range(400):
            clock.t += rng.choice([0.0, 0.05, 0.5, 1.0, 3.0, 20.0])
            chosen = rng.sample(limits, rng.randint(1, 3))
            mode = rng.choice([Mode.ADMIT, Mode.ADMIT, Mode.CHARGE, Mode.PEEK])
            ops = []
            for lim in chosen:
                key = f"{lim.id}|s{rng.randint(0, 1)}"
                scale = 0.00001 if lim.metric.value == "usd" else 1
                need = rng.randint(0, 300) * scale
                charge = need + rng.randint(0, 100) * scale
                slot = -1
                if mode is Mode.CHARGE and slots.get(key) and rng.random() < 0.5:
                    slot = rng.choice(slots[key])
                    charge = -rng.randint(1, 200) * scale
                ops.append(Op(key, lim, need, charge, slot))
            lok, lres = local.run(ops, mode, clock.t)
            rok, rres = await store.run(ops, mode)
            assert lok == rok, f"step {step}"
            for op, a, b in zip(ops, lres, rres, strict=True):
                tol = 1e-6 * op.limit.amount
                assert a.remaining == pytest.approx(b.remaining, abs=tol), f"step {step} {op}"
                assert a.retry_after == pytest.approx(b.retry_after, abs=1e-6), f"step {step} {op}"
                assert a.reset_after == pytest.approx(b.reset_after, abs=1e-6), f"step {step} {op}"
                assert a.slot == b.slot
                if a.slot >= 0:
                    slots.setdefault(op.key, []).append(a.slot)
        await store.close()

    asyncio.run(main())


def test_evalsha_falls_back_to_eval_when_the_server_lost_the_script(shared_redis: RedisServer) -> None:
    sync = redis_sync.Redis.from_url(shared_redis.url)

    async def main() -> None:
        store = RedisStore(shared_redis.url, timeout_s=2.0, key_prefix="noscript")
        lim = Limit.per_unit("r", "input_tokens", 100, "minute", shared=True)
        sync.script_flush()
        assert sync.script_exists(SCRIPT_SHA) == [False]
        ok, res = await store.run([Op("k", lim, 10, 10)], Mode.ADMIT)  # NOSCRIPT -> EVAL, which caches it
        assert ok and res[0].remaining == pytest.approx(90, abs=0.01)
        assert sync.script_exists(SCRIPT_SHA) == [True]
        ok, res = await store.run([Op("k", lim, 10, 10)], Mode.ADMIT)  # EVALSHA from now on
        # the bucket refills 100 a minute in real time: 0.01 is 6 ms between the two calls, which a busy machine
        # outlasts; what is checked here is that the second call ran the script (a refill is under 1 in 0.6 s)
        assert ok and 80 <= res[0].remaining < 81
        await store.close()

    asyncio.run(main())
    stats = sync.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] >= 2 and stats["cmdstat_eval"]["calls"] >= 1


def test_every_key_has_a_ttl_and_full_state_is_deleted(shared_redis: RedisServer) -> None:
    sync = redis_sync.Redis.from_url(shared_redis.url)

    async def main() -> None:
        clock = Clock()
        store = RedisStore(shared_redis.url, clock=clock, timeout_s=2.0, key_prefix="ttl")
        bucket = Limit.per_unit("r", "input_tokens", 100, "hour", shared=True)
        window = Limit.rolling("b", "total_tokens", 100, 120, shared=True)
        await store.run([Op("kb", bucket, 50, 50), Op("kw", window, 50, 50)], Mode.ADMIT)
        ttl_b, ttl_w = sync.pttl("ttl:kb"), sync.pttl("ttl:kw")
        assert 1_800_000 <= ttl_b <= 1_802_000  # refills 50 of 100 per hour: full again in half an hour
        assert 120_000 <= ttl_w <= 124_000  # the window plus two slots
        ok, res = await store.run([Op("kb", bucket, 0, -50)], Mode.CHARGE)  # refunded: full again, nothing kept
        assert res[0].remaining == pytest.approx(100) and sync.exists("ttl:kb") == 0
        await store.close()

    asyncio.run(main())


def test_redis_url_forms_and_redaction() -> None:
    assert normalize_url("redis-server.kthena-system.svc.cluster.local:6379") == \
        "redis://redis-server.kthena-system.svc.cluster.local:6379"
    assert redact("redis://user:hunter2@10.0.0.1:6379/2") == "redis://10.0.0.1:6379/2"
    assert redact("rediss://:hunter2@[::1]:6380") == "rediss://[::1]:6380"
    assert "hunter2" not in RedisStore("redis://:hunter2@127.0.0.1:1/0").address
    with pytest.raises(ValueError):
        RedisStore("127.0.0.1:1", timeout_s=0)


# ---- limiters sharing Redis -----------------------------------------------------------------------------------
def test_two_limiters_share_rate_limits_and_budgets(shared_redis: RedisServer) -> None:
    async def main() -> None:
        a = Limiter(redis=RedisStore(shared_redis.url, timeout_s=2.0, key_prefix="pair"))
        b = Limiter(redis=RedisStore(shared_redis.url, timeout_s=2.0, key_prefix="pair"))
        rate = Limit.per_unit("route", "input_tokens", 100, "day", shared=True)
        usd = Limit.rolling("spend", "usd", 0.002, 3600, shared=True)
        price = Price(1.0, 4.0)  # USD per million tokens
        first = await a.admit([(rate, ""), (usd, "team-a")], 60, price=price)
        assert first.allowed and not first.degraded
        refused = await b.admit([(rate, ""), (usd, "team-a")], 60, price=price)  # the other replica sees the 60
        assert not refused.allowed and "input token rate limit exceeded" in refused.message
        assert dict(refused.headers)["x-ratelimit-remaining"] == "40"
        a.settle(first.ticket, output_tokens=480)  # $0.00006 + $0.00192 = $0.00198 of $0.002
        await a.flush()
        over = await b.admit([(usd, "team-a")], 30, price=price)  # $0.00003 > $0.00002 left
        assert not over.allowed and "budget \"spend\" exhausted: $0.00198 of $0.002 used" in over.message
        assert (await b.admit([(usd, "team-b")], 30, price=price)).allowed  # its own team budget
        await b.refresh()
        spent = {(s.name, s.scope): s for s in b.budgets()}
        assert spent[("spend", "team-a")].usd_used == pytest.approx(0.00198)
        assert spent[("spend", "team-a")].utilization == pytest.approx(0.99)
        await a.close()
        await b.close()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("scenario,amount", [("rate", 60_000), ("budget", 120_000)])
def test_two_processes_admit_together_within_5_percent(shared_redis: RedisServer, scenario: str,
                                                       amount: int) -> None:
    """Two real OS processes, each with its own Limiter and 24 concurrent workers, hammer one shared limit until
    refused; together they admit between 95 % and 100 % (plus at most one output overrun) of it, and what Redis
    holds is exactly what the two processes settled."""
    sync = redis_sync.Redis.from_url(shared_redis.url)
    sync.flushdb()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.ratelimit_driver", "--redis-url",
                               shared_redis.url, "--scenario", scenario, "--amount", str(amount), "--seed", str(i + 1),
                               "--barrier", "--max-seconds", "60"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(2)]
    try:
        for p in procs:  # both connected and ready: then both go at once
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=110)
            assert p.returncode == 0, err.decode()[-2000:]
            outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(o["admitted"] > 0 and o["degraded"] == 0 and o["pending"] == 0 for o in outs), outs
    if scenario == "rate":
        admitted = sum(o["admitted_input"] for o in outs)
        assert 0.95 * amount <= admitted <= amount + 1, outs  # +1: the month-long bucket's refill during the run
        state = sync.hgetall("pointsman:{rl}:rate:shared-route:input_tokens|-")
        level = float(state[b"l"])
        assert amount - admitted == pytest.approx(level, abs=1.0)
    else:
        settled = sum(o["settled_total"] for o in outs)
        assert 0.95 * amount <= settled <= amount + 200, outs  # + the last request's output, never above 200
        fields = sync.hgetall("pointsman:{rl}:budget:shared-budget:total_tokens|-")
        assert sum(float(v) for v in fields.values()) == pytest.approx(settled, abs=1e-6)


# ---- Redis down ------------------------------------------------------------------------------------------------
def test_redis_killed_local_policy_then_back(own_redis: RedisServer) -> None:
    async def main() -> None:
        metrics = RateLimitMetrics()
        store = RedisStore(own_redis.url, timeout_s=0.05)
        limiter = Limiter(redis=store, redis_down="local", replicas=2, retry_interval_s=0.3, metrics=metrics)
        metrics.bind(limiter)
        assert await limiter.probe(timeout_s=5.0)  # start-up: connection and script ready for a 50 ms budget
        shared = Limit.per_unit("route", "input_tokens", 100, "day", shared=True)
        local = Limit.per_unit("local-route", "input_tokens", 1000, "day")
        assert not (await limiter.admit([(shared, ""), (local, "")], 30)).degraded
        own_redis.kill()
        t0 = time.perf_counter()
        adm = await limiter.admit([(shared, ""), (local, "")], 40)
        elapsed = time.perf_counter() - t0
        assert elapsed < 0.05 + 0.5
        assert adm.allowed and adm.degraded  # enforced here, at 100 / 2 replicas
        assert not limiter.redis_healthy and fallbacks(metrics) == 1
        refused = await limiter.admit([(shared, "")], 20)  # 50 - 40 = 10 left in this replica's share
        assert not refused.allowed and refused.degraded and "allows 50 input tokens per day" in refused.message
        assert fallbacks(metrics) == 2  # skipped Redis (down), answered by the policy
        text = generate_latest(metrics.registry).decode()
        assert "pointsman_ratelimit_redis_up 0.0" in text
        assert 'pointsman_ratelimit_redis_fallback_total{op="admit",policy="local",reason="down"} 1.0' in text
        assert not await limiter.probe()  # still dead
        own_redis.restart()  # an empty server: no state, no script loaded
        for _ in range(10):  # the next try after the retry interval finds it (a loaded machine may need two)
            await asyncio.sleep(0.35)
            back = await limiter.admit([(shared, "")], 60)
            if not back.degraded:
                break
            limiter.refund(back.ticket)
        assert back.allowed and not back.degraded and limiter.redis_healthy
        assert dict(back.headers)["x-ratelimit-remaining"] == "40"  # global again, from Redis's (new) state
        assert "pointsman_ratelimit_redis_up 1.0" in generate_latest(metrics.registry).decode()
        assert len(limiter.fallback) == 0  # the outage's local state is dropped
        await limiter.close()

    asyncio.run(main())


def test_redis_killed_fail_open_keeps_local_limits(own_redis: RedisServer) -> None:
    async def main() -> None:
        limiter = Limiter(redis=RedisStore(own_redis.url, timeout_s=0.05), redis_down="fail-open",
                          retry_interval_s=30)
        shared = Limit.per_unit("route", "input_tokens", 10, "day", shared=True)
        local = Limit.per_unit("local-route", "input_tokens", 100, "day")
        own_redis.kill()
        for _ in range(5):
            adm = await limiter.admit([(shared, ""), (local, "")], 15)  # over the shared limit, but it is open
            assert adm.allowed and adm.degraded
            assert 'name="route"' not in dict(adm.headers)["x-ratelimit-limit"]  # nothing true to tell about it
        assert not (await limiter.admit([(shared, ""), (local, "")], 50)).allowed  # the local limit still holds
        await limiter.close()

    asyncio.run(main())


def test_hung_redis_costs_at_most_the_timeout_and_settles_count_once(own_redis: RedisServer) -> None:
    """SIGSTOP: Redis stops answering, connections hang. A settle sent on an open connection times out and is
    kept; admissions return within the timeout (+ margin) and skip Redis until the retry interval passed. After
    SIGCONT the server runs the settle it had received, and the limiter's resend of that batch (same id) is not
    counted again: Redis holds the settle exactly once."""

    async def main() -> None:
        metrics = RateLimitMetrics()
        timeout = 0.03
        clock = Clock()  # the retry interval is measured on the limiter's clock: the test moves it
        limiter = Limiter(redis=RedisStore(own_redis.url, timeout_s=timeout), redis_down="local",
                          retry_interval_s=1.0, metrics=metrics, clock=clock)
        assert await limiter.probe(timeout_s=5.0)
        hot = Limit.per_unit("hot", "input_tokens", 10_000, "day", shared=True)
        tally = Limit.rolling("tally", "total_tokens", 10_000, 3600, shared=True)
        kept = await limiter.admit([(tally, "")], 100)  # opens a connection, left idle in the pool
        assert kept.allowed and not kept.degraded
        own_redis.pause()
        try:
            limiter.settle(kept.ticket, output_tokens=25)  # sent on the open connection: the server gets it
            t0 = time.perf_counter()
            await limiter.flush()
            assert time.perf_counter() - t0 < timeout + 0.5
            assert limiter.pending == 1 and not limiter.redis_healthy and fallbacks(metrics) == 1
            t0 = time.perf_counter()
            for _ in range(20):
                adm = await limiter.admit([(hot, "")], 1)
                assert adm.allowed and adm.degraded
            assert time.perf_counter() - t0 < timeout + 0.5  # twenty admissions, none waited for Redis
            clock.t += 1.05  # past the retry interval (Redis stays paused until the finally)
            t0 = time.perf_counter()
            adm = await limiter.admit([(hot, "")], 1)  # the retry interval passed: this one tries Redis
            assert time.perf_counter() - t0 < timeout + 0.5
            assert adm.allowed and adm.degraded and fallbacks(metrics) == 22
        finally:
            own_redis.resume()
        sync = redis_sync.Redis.from_url(own_redis.url, socket_timeout=1)
        await until(lambda: asyncio.to_thread(answers, sync), 10, "Redis to answer after SIGCONT")
        clock.t += 1.05  # past the retry interval that the last failed try started
        back = await limiter.admit([(hot, "")], 1)
        assert not back.degraded and limiter.redis_healthy
        await limiter.flush()
        assert limiter.pending == 0
        fields = sync.hgetall("pointsman:{rl}:budget:tally:total_tokens|-")
        assert sum(float(v) for v in fields.values()) == pytest.approx(125)  # 100 admitted + 25 settled, once
        await limiter.close()

    asyncio.run(main())


def test_redis_hangs_mid_run_under_concurrent_load(own_redis: RedisServer) -> None:
    """32 concurrent clients admit without pause; Redis hangs (SIGSTOP) mid-run and comes back. No admission
    waits longer than the timeout (+ margin), the policy answers meanwhile, and admissions are global again
    after Redis returns."""

    async def main() -> None:
        metrics = RateLimitMetrics()
        timeout = 0.1
        limiter = Limiter(redis=RedisStore(own_redis.url, timeout_s=timeout), redis_down="local", replicas=2,
                          retry_interval_s=0.2, metrics=metrics)
        assert await limiter.probe(timeout_s=5.0)  # start-up: a connection open, the script loaded
        shared = Limit.per_unit("busy", "input_tokens", 10**9, "day", shared=True)
        log: list[tuple[float, float, bool]] = []  # (start, seconds, degraded)
        t_start = time.perf_counter()
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                adm = await limiter.admit([(shared, "")], 10, 5)
                log.append((t0 - t_start, time.perf_counter() - t0, adm.degraded))
                assert adm.allowed
                limiter.settle(adm.ticket, output_tokens=3)
                await asyncio.sleep(0.002)

        marks: dict[str, float] = {}

        def later_than(t: float) -> list[tuple[float, float, bool]]:
            return [x for x in log if x[0] > t]

        async def chaos() -> None:
            try:
                await until(lambda: [deg for _, _, deg in log].count(False) >= 100, 10,
                            "a hundred admissions answered by Redis before the hang")
                own_redis.pause()
                marks["paused"] = time.perf_counter() - t_start
                # A window in which nothing may happen: no admission waits for the hung Redis. It clearly outlasts
                # the bound checked below (timeout + 0.5 s), so an admission that waited for Redis would break it.
                await asyncio.sleep(1.0)
                marks["resumed"] = time.perf_counter() - t_start
                own_redis.resume()
                await until(lambda: len(later_than(marks["resumed"] + 0.7)) >= 200, 10,
                            "two hundred admissions from 0.7 s after Redis came back")
            finally:
                stop.set()

        try:
            await asyncio.gather(chaos(), *(client() for _ in range(32)))
        finally:
            own_redis.resume()
        worst = max(d for _, d, _ in log)
        assert worst < timeout + 0.5, worst  # the margin is the event loop's own delay under 32 clients
        during = [deg for t, d, deg in log if marks["paused"] + 0.01 < t and t + d < marks["resumed"]]
        after = [deg for _, _, deg in later_than(marks["resumed"] + 0.7)]
        assert during and all(during)  # the policy answered while Redis hung
        assert after and after.count(False) >= len(after) / 2  # global again (a loaded machine may blip)
        assert fallbacks(metrics) >= len(during)
        await limiter.close()

    asyncio.run(main())


def test_an_admission_cancelled_while_waiting_for_redis_leaves_no_local_charge(own_redis: RedisServer) -> None:
    async def main() -> None:
        limiter = Limiter(redis=RedisStore(own_redis.url, timeout_s=5.0))
        shared = Limit.per_unit("shared", "input_tokens", 1000, "day", shared=True)
        local = Limit.per_unit("local", "input_tokens", 1000, "day")
        assert (await limiter.admit([(shared, ""), (local, "")], 10)).allowed
        own_redis.pause()
        try:
            task = asyncio.ensure_future(limiter.admit([(shared, ""), (local, "")], 300))
            await until(lambda: {r.name: r.used for r in limiter.snapshot()}["local"] > 10.1, 5,
                        "the admission to charge the local limit")
            assert {r.name: r.used for r in limiter.snapshot()}["local"] == pytest.approx(310, abs=0.1)  # charged, waiting
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            own_redis.resume()
        assert {r.name: r.used for r in limiter.snapshot() if r.source == "local"}["local"] == pytest.approx(10, abs=0.1)
        await limiter.close()

    asyncio.run(main())


def test_credentials_never_show(own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    sync = redis_sync.Redis.from_url(own_redis.url)
    sync.config_set("requirepass", "right-horse-battery")
    secret = "hunter2-staple"

    async def main() -> None:
        metrics = RateLimitMetrics()
        wrong = Limiter(redis=RedisStore(f"redis://:{secret}@127.0.0.1:{own_redis.port}/0", timeout_s=0.5),
                        metrics=metrics, redis_down="local")
        metrics.bind(wrong)
        shared = Limit.per_unit("route", "input_tokens", 10, "day", shared=True)
        with caplog.at_level(logging.DEBUG):
            adm = await wrong.admit([(shared, "")], 5)
            refused = await wrong.admit([(shared, "")], 50)
        assert adm.degraded and not refused.allowed
        shown = " ".join([caplog.text, adm.message, repr(adm.headers), refused.message, repr(refused.headers),
                          generate_latest(metrics.registry).decode(), repr(wrong.snapshot()),
                          wrong.redis.address if wrong.redis else ""])
        assert secret not in shown and "right-horse-battery" not in shown
        assert f"redis://127.0.0.1:{own_redis.port}/0" in caplog.text  # the address, without credentials
        await wrong.close()
        right = Limiter(redis=RedisStore(f"redis://:right-horse-battery@127.0.0.1:{own_redis.port}/0",
                                         timeout_s=0.5))
        assert not (await right.admit([(shared, "")], 5)).degraded
        await right.close()

    asyncio.run(main())
