"""The model-server metrics scraper: GET /metrics of every endpoint every `interval` (50 ms by default).

Each endpoint's page is read through its `MetricsSource` (source.py: where the page is, its parser, one keep-alive
HTTP client for every endpoint); at most `concurrency` scrapes run at once and each has its own `timeout` (`bounded_timeout`: short enough that `failure_threshold` hung scrapes in a row
fit in the staleness threshold, 0.45 s with the defaults, at most 1 s). A round launches a scrape for every endpoint that has none pending,
waits up to one interval for them, and writes every result that came back, plus staleness marks, to the datastore
in ONE `update_metrics` batch. A slow endpoint therefore never holds up the others: its scrape stays pending and
its result lands in a later round.

Spread: the background loop (`run`) does not scrape every endpoint at the same instant. It splits each interval
into `slots` ticks (one per endpoint, at most one per `MIN_TICK` seconds) and scrapes the endpoints of one slot
(the sorted keys, dealt round robin) per tick, publishing what came back each tick. Each endpoint is still scraped
once per interval, but a request no longer meets a burst of every endpoint's response and parse on the event loop
at once: with 8 vLLM endpoints at 50 ms (about 0.9 ms of loop time per scrape), the burst was 8 scrapes, and the
time a routed request spent on its way to the engine and back had a p90 of 17 ms (docs/routing-benchmark.md). An
explicit `scrape_round()` still scrapes every endpoint that is due, and so does the loop's first round.
A tick costs what its slot holds, not what the pool holds: the sorted keys (the roster) are rebuilt only when a
pool changes, the scrapes in flight are a set of keys, and endpoints are looked up by key.

Staleness: an endpoint whose last good scrape is older than `staleness` (2 s) gets `stale=True` in the batch of
the tick that holds its slot (so within one interval of crossing the threshold).
Health: `failure_threshold` (3) consecutive failures (connection error, timeout, non-200, unparsable body) put the
endpoint key in `datastore.unhealthy`; the first good scrape takes it out again. The director skips unhealthy keys
through `datastore.is_routable(key)`.

Backoff: an endpoint that is out is scraped less often: after its k-th failure past the threshold the next scrape
waits interval × 2^k, capped at `backoff_max` (1 s): a dead endpoint costs about one failed connect a second instead of
twenty, and a recovered one is back within `backoff_max` plus a round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from epp.aio import cancel_and_wait
from epp.fleet.datastore import Datastore
from epp.fleet.scrape.source import MetricsSource
from epp.fleet.settings import BACKOFF_MAX_S, ScrapeSettings
from epp.fleet.settings import bounded_timeout as bounded_timeout  # where it was
from scheduling.types import Endpoint, Metrics

log = logging.getLogger(__name__)

MIN_TICK = 0.005  # seconds: the background loop's shortest tick (see "Spread")
SCRAPE_CPU_S = 0.00036  # CPU per scrape of vLLM's page, HTTP and parse (bench/bench_scrape.py --http)
WARN_SHARE = 0.25  # of a core spent scraping, past which the pool's size is worth a warning


@dataclass(slots=True)
class _State:
    failures: int = 0
    last_error: str = ""
    pending: asyncio.Task[Metrics] | None = None
    next_at: float = 0.0  # while out: no scrape before this (the backoff)


def period_latency(new: Metrics, old: Metrics | None) -> Metrics:
    """TTFT and TPOT as the mean over the last scrape period: Δsum / Δcount of the engine's histograms. A period
    in which no request finished keeps the previous means; a counter that went back (engine restart) starts over."""
    totals = new.latency_totals
    if totals is None:
        return new
    prev = old.latency_totals if old is not None else None
    ttft = old.ttft_s if old is not None else None
    tpot = old.tpot_s if old is not None else None
    if prev is not None and all(n >= p for n, p in zip(totals, prev, strict=True)):
        if totals[1] > prev[1]:
            ttft = (totals[0] - prev[0]) / (totals[1] - prev[1])
        if totals[3] > prev[3]:
            tpot = (totals[2] - prev[2]) / (totals[3] - prev[3])
    elif prev is not None:
        ttft = tpot = None
    return replace(new, ttft_s=ttft, tpot_s=tpot)


class MetricsScraper:
    def __init__(
        self,
        datastore: Datastore,
        interval: float = 0.05,
        timeout: float = 1.0,
        staleness: float = 2.0,
        concurrency: int = 128,
        failure_threshold: int = 3,
        clock: Callable[[], float] = time.monotonic,
        backoff_max: float = BACKOFF_MAX_S,
        source: MetricsSource | None = None,
    ) -> None:
        if interval <= 0 or timeout <= 0 or staleness <= 0:
            raise ValueError("interval, timeout and staleness must be positive")
        self.datastore = datastore
        self.interval = interval
        self.timeout = timeout
        self.staleness = staleness
        self.failure_threshold = max(1, failure_threshold)
        self.backoff_max = max(0.0, backoff_max)
        self.source = source or MetricsSource()  # where and how each endpoint's page is read
        self.clock = clock
        datastore.on_endpoint_removed(self.forget)
        self._sem = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._state: dict[str, _State] = {}
        self._roster: list[str] | None = None  # every endpoint key, sorted; None after a pool changed
        self._inflight: set[str] = set()  # keys whose state holds a pending scrape
        self._warned_share = False  # the pool's scraping share was over WARN_SHARE at the last roster
        datastore.on_change(self._pools_changed)
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        """Run scrape rounds forever on the running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="metrics-scraper")
        return self._task

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for st in self._state.values():
            if st.pending is not None:
                st.pending.cancel()
        pend = [st.pending for st in self._state.values() if st.pending is not None]
        if pend:
            await asyncio.gather(*pend, return_exceptions=True)
        self._state.clear()
        self._inflight.clear()
        self._roster = None
        await self.source.close()

    def slots(self, endpoints: int) -> int:
        """How many ticks an interval is split into for `endpoints` endpoints (see "Spread")."""
        return max(1, min(endpoints, int(self.interval / MIN_TICK)))

    async def run(self) -> None:
        slot, first = 0, True
        while True:
            started = self.clock()
            slots = 1 if first else self.slots(len(self.roster()) or 1)  # the first round scrapes every endpoint
            slot %= slots
            tick = self.interval / slots
            try:
                await self.scrape_round(wait=tick, slot=slot, slots=slots)
            except Exception:  # the loop must survive anything a round throws
                log.exception("metrics scrape round failed")
            slot, first = slot + 1, False
            await asyncio.sleep(max(0.0, tick - (self.clock() - started)))

    # ---- the roster ----------------------------------------------------------------------------------------
    def _pools_changed(self, pool: str) -> None:
        self._roster = None

    def roster(self) -> list[str]:
        """Every endpoint key in some pool, sorted, each with a state; rebuilt after a pool changed."""
        roster = self._roster
        if roster is None:
            roster = self._roster = sorted(self.datastore.members())
            state = self._state
            for key in roster:
                if key not in state:
                    state[key] = _State()
            self._size_check(len(roster))
        return roster

    def share(self, endpoints: int) -> float:
        """About how much of a core scraping `endpoints` every interval takes (vLLM's page: SCRAPE_CPU_S each)."""
        return endpoints / self.interval * SCRAPE_CPU_S

    def _size_check(self, endpoints: int) -> None:
        """Warn once when the pool grows past what the interval lets the event loop scrape beside its requests."""
        share = self.share(endpoints)
        over = share > WARN_SHARE
        if over and not self._warned_share:
            log.warning("scraping %d endpoints every %.0f ms takes about %.0f%% of a core on the event loop that "
                        "routes requests (about %.2f ms of CPU per scrape); --refresh-metrics-interval %.0fms or "
                        "more keeps it near %.0f%%", endpoints, self.interval * 1e3, share * 100, SCRAPE_CPU_S * 1e3,
                        endpoints * SCRAPE_CPU_S / WARN_SHARE * 1e3, WARN_SHARE * 100)
        self._warned_share = over

    # ---- one round ---------------------------------------------------------------------------------------
    async def scrape_round(self, wait: float | None = None, slot: int = 0, slots: int = 1) -> int:
        """Launch the scrapes of slot `slot` of `slots` (the sorted endpoint keys dealt round robin; by default
        every endpoint), wait up to `wait` (default: one interval) for every pending scrape, publish what came back
        and mark the slot's endpoints stale whose last good scrape is too old. Returns endpoints updated."""
        roster = self.roster()
        due = roster if slots <= 1 else roster[slot % slots::slots]
        state, inflight, endpoint = self._state, self._inflight, self.datastore.endpoint
        now = self.clock()
        for key in due:
            st = state[key]
            if st.pending is None and now >= st.next_at:
                ep = endpoint(key)
                if ep is not None:
                    st.pending = asyncio.ensure_future(self._scrape(ep))
                    inflight.add(key)
        pending = [t for k in inflight if (t := state[k].pending) is not None and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.interval if wait is None else wait)
        updates = self._harvest(due)
        self.rounds += 1
        if updates:
            self.datastore.update_metrics(updates)
        return len(updates)

    def _harvest(self, due: list[str]) -> dict[str, Metrics]:
        updates: dict[str, Metrics] = {}
        endpoint = self.datastore.endpoint
        done = [k for k in self._inflight if (t := self._state[k].pending) is None or t.done()]
        for key in done:
            self._inflight.discard(key)
            st = self._state[key]
            task = st.pending
            st.pending = None
            if task is None or task.cancelled():
                continue
            err = task.exception()
            if err is None:
                ep = endpoint(key)
                updates[key] = period_latency(task.result(), ep.metrics if ep is not None else None)
                if st.failures >= self.failure_threshold:
                    log.info("endpoint %s scrapes again; back in rotation", key)
                st.failures, st.last_error, st.next_at = 0, "", 0.0
                self.datastore.set_unhealthy(key, False)
            else:
                st.failures += 1
                st.last_error = f"{type(err).__name__}: {err}"
                if st.failures == self.failure_threshold:
                    log.warning(
                        "endpoint %s failed %d scrapes in a row (%s); out of rotation until it recovers",
                        key, st.failures, st.last_error,
                    )
                if st.failures >= self.failure_threshold:
                    self.datastore.set_unhealthy(key, True)
                    st.next_at = self.clock() + self.backoff(st.failures)
        now = self.clock()
        for key in due:
            if key in updates:
                continue
            ep = endpoint(key)
            if ep is None:
                continue
            m = ep.metrics
            if not m.stale and m.updated_at is not None and now - m.updated_at > self.staleness:
                updates[key] = replace(m, stale=True)
        return updates

    def backoff(self, failures: int) -> float:
        """The wait before the next scrape of an endpoint that failed `failures` times in a row (0 below the
        threshold): interval × 2^(failures − threshold + 1), capped at backoff_max."""
        past = failures - self.failure_threshold
        if past < 0:
            return 0.0
        return min(self.backoff_max, self.interval * (2.0 ** min(past + 1, 30)))

    async def _scrape(self, ep: Endpoint) -> Metrics:
        async with self._sem:
            return await self.source.read(ep, self.timeout, self.clock)

    def forget(self, key: str) -> None:
        """The endpoint left the pool (datastore lifecycle): drop its failure streak and any pending scrape."""
        st = self._state.pop(key, None)
        self._inflight.discard(key)
        self.source.forget(key)
        if st is not None and st.pending is not None:
            st.pending.cancel()

    # ---- introspection -----------------------------------------------------------------------------------
    def failures(self, key: str) -> int:
        st = self._state.get(key)
        return st.failures if st else 0

    def last_error(self, key: str) -> str:
        st = self._state.get(key)
        return st.last_error if st else ""


async def start_scraper(datastore: Datastore, settings: ScrapeSettings | None = None) -> MetricsScraper:
    """Create a scraper from its settings (`--refresh-metrics-interval`, `--metrics-staleness-threshold`,
    `--scrape-timeout`) and start its loop on the running event loop. Call `await scraper.stop()` on shutdown."""
    s = settings or ScrapeSettings()
    scraper = MetricsScraper(datastore, interval=s.interval, timeout=s.timeout, staleness=s.staleness,
                             backoff_max=s.backoff_max)
    scraper.start()
    return scraper
