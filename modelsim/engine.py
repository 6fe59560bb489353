"""The simulated vLLM engine core: continuous batching over a paged, prefix-cached KV cache.

Pure and clock-injected: every call takes `now` (model seconds) and nothing reads a clock. The async
driver (modelsim.driver) calls `advance(now)` and sleeps until `next_event_time()`.

Latency model (per request, as llm-d-inference-sim):
    load(r)  = 1 + (F − 1)(r − 1)/(max_num_seqs − 1), r = running requests including this one
    TTFT     = (prefill_overhead + uncached_prompt_tokens × prefill_per_token) × load(r at admission)
               (P/D decode requests: kv_transfer_overhead + prompt_tokens × kv_transfer_per_token)
    ITL      = itl × load(r at that token)
The first token is never earlier than the moment the cached blocks it reuses finished computing.

Scheduling: at most `max_num_seqs` running; the rest wait FIFO (up to `max_waiting`, then QueueFull).
A waiting request whose LoRA is active, or can be activated within `max_loras`, may overtake one whose
LoRA cannot. A request is admitted only when the cache can hold its prompt (+1 block); a running
request that needs a new decode block when the cache is full preempts the most recently admitted
request (vLLM's recompute preemption), which returns to the head of the queue.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from modelsim.config import EngineConfig
from modelsim.kvcache import KVCache, MMItem, block_hashes, extra_keys


class EngineError(Exception):
    """A request the engine refuses. `status` is the HTTP status to return."""

    status = 400


class QueueFull(EngineError):
    status = 429


class PromptTooLong(EngineError):
    status = 400


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: Sequence[int]
    output_tokens: int  # how many tokens to generate (>= 1)
    lora: str | None = None
    mm: tuple[MMItem, ...] = ()  # media items: (offset, length, mm hash) of their placeholder tokens
    remote_decode: bool = False  # P/D prefill side: one token, then finish_reason remote_decode
    remote_prefill: bool = False  # P/D decode side: TTFT is the KV transfer time
    finish_reason: str = "length"  # reported when all output_tokens are produced


WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Seq:
    req: SimRequest
    arrival: float
    state: str = WAITING
    hashes: list[int] = field(default_factory=list)  # hashed blocks held
    chain: list[int] | None = None  # the prompt's block hashes, computed once
    n_private: int = 0
    generated: int = 0
    cached_tokens: int = 0  # prefix-cache hit at (first) admission
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    gen: int = 0  # bumps on preempt/cancel to invalidate heap entries
    order: int = 0  # admission order, for preemption victim choice

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival


# Output events: ("token", seq, time) and ("finish", seq, time).
Event = tuple[str, Seq, float]


class EngineObserver(Protocol):
    """Told of every timing event at its exact model time, as the engine computes it (metrics, request records).

    `admitted` fires at a request's first admission only (a preempted request's re-admission is not a new one);
    `token` at every generated token with the gap since the request's previous token (None for the first);
    `finished` when the last token is out; `aborted` when a request is cancelled before finishing."""

    def admitted(self, seq: Seq, now: float) -> None: ...

    def token(self, seq: Seq, t: float, gap: float | None) -> None: ...

    def finished(self, seq: Seq, t: float) -> None: ...

    def aborted(self, seq: Seq, now: float) -> None: ...


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens
    prefix_hits: int = 0  # tokens
    preemptions: int = 0
    success: Counter = field(default_factory=Counter)  # finish_reason -> count


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.cfg = config
        self.kv = KVCache(config.kv_cache_size, config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.stats = EngineStats()
        self._heap: list[tuple[float, int, int, Seq]] = []  # (time, tiebreak, gen, seq)
        self._tie = 0
        self._order = 0
        self._out: list[Event] = []
        self.observers: list[EngineObserver] = []

    # ---- public API -------------------------------------------------------------------------------
    def load(self, running: int | None = None) -> float:
        r = len(self.running) if running is None else running
        m = self.cfg.max_num_seqs
        if m <= 1:
            return 1.0
        return 1.0 + (self.cfg.load_factor - 1.0) * max(0, r - 1) / (m - 1)

    def submit(self, req: SimRequest, now: float) -> Seq:
        """Queue a request; it is admitted at once when there is room. Raises EngineError."""
        n_prompt = len(req.prompt_tokens)
        if n_prompt + req.output_tokens > self.cfg.max_model_len:
            raise PromptTooLong(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens; the request has "
                f"{n_prompt} prompt tokens and asks for {req.output_tokens} more. Shorten the prompt or max_tokens."
            )
        if self._blocks_for(n_prompt + max(1, req.output_tokens)) > self.cfg.kv_cache_size:
            raise PromptTooLong(
                f"the request ({n_prompt} prompt + {req.output_tokens} output tokens) does not fit in the KV "
                f"cache ({self.cfg.kv_cache_size} blocks of {self.cfg.block_size} tokens); shorten it"
            )
        if len(self.waiting) >= self.cfg.max_waiting:
            raise QueueFull(f"waiting queue is full ({self.cfg.max_waiting} requests); retry later")
        seq = Seq(req=req, arrival=now)
        if req.output_tokens < 1:
            req.output_tokens = 1
        self.waiting.append(seq)
        self._admit(now)
        return seq

    def cancel(self, seq: Seq, now: float) -> None:
        """Abort a request (client went away). Safe to call on a finished request."""
        if seq.state == WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        elif seq.state == RUNNING:
            self._release(seq)
        if seq.state != FINISHED:
            seq.state, seq.finished_at, seq.finish_reason = FINISHED, now, "abort"
            seq.gen += 1
            for ob in self.observers:
                ob.aborted(seq, now)
            self._admit(now)

    def next_event_time(self) -> float | None:
        while self._heap and self._heap[0][2] != self._heap[0][3].gen:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance(self, now: float) -> list[Event]:
        """Process every token due at or before `now`, in time order. Returns the output events."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, gen, seq = heapq.heappop(heap)
            if gen != seq.gen or seq.state != RUNNING:
                continue
            self._emit_token(seq, t)
        out, self._out = self._out, []
        return out

    def probe(self, tokens: Sequence[int], lora: str | None = None, mm: Sequence[MMItem] = ()) -> int:
        """Cached prefix length, in tokens, a request with these tokens would get now (no side effects)."""
        return self.kv.match(self._hashes(tokens, lora, mm)) * self.cfg.block_size

    def kv_chain(self, tokens: Sequence[int], lora: str | None = None) -> list[int]:
        """The block hashes of every full block of `tokens` (as this engine caches them)."""
        n = len(tokens) // self.cfg.block_size * self.cfg.block_size
        return block_hashes(tokens[:n], self.cfg.block_size, lora) if self.cfg.enable_prefix_caching else []

    def active_loras(self) -> list[str]:
        return sorted({s.req.lora for s in self.running if s.req.lora})

    def waiting_loras(self) -> list[str]:
        return sorted({s.req.lora for s in self.waiting if s.req.lora})

    def reset_prefix_cache(self, now: float, reset_running_requests: bool = False) -> bool:
        """vLLM's reset: refused (False) while running requests hold blocks, unless `reset_running_requests`,
        which first preempts every running request back to the head of the queue (they are recomputed)."""
        if reset_running_requests:
            while self.running:
                self._preempt(now)  # the latest admitted first, so the queue keeps arrival order
        ok = self.kv.clear()
        if reset_running_requests:
            self._admit(now)
        return ok

    # ---- internals --------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _hashes(self, tokens: Sequence[int], lora: str | None, mm: Sequence[MMItem] = ()) -> list[int]:
        if not self.cfg.enable_prefix_caching:
            return []
        # vLLM recomputes at least the last prompt token, so a full hit never covers the whole prompt.
        usable = max(0, len(tokens) - 1)
        n = usable // self.cfg.block_size * self.cfg.block_size
        return block_hashes(tokens[:n], self.cfg.block_size, lora, mm)

    def _push(self, seq: Seq, t: float) -> None:
        self._tie += 1
        heapq.heappush(self._heap, (t, self._tie, seq.gen, seq))

    def _lora_ok(self, seq: Seq, active: set[str]) -> bool:
        lora = seq.req.lora
        return lora is None or lora in active or len(active) < self.cfg.max_loras

    def _admit(self, now: float) -> None:
        cfg = self.cfg
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            active = {s.req.lora for s in self.running if s.req.lora}
            seq = next((s for s in self.waiting if self._lora_ok(s, active)), None)
            if seq is None:
                return
            if not self._start(seq, now):
                return  # head-of-line: wait for blocks to free up
            self.waiting.remove(seq)

    def _start(self, seq: Seq, now: float) -> bool:
        cfg, req = self.cfg, seq.req
        # After a preemption the generated tokens are recomputed along with the prompt.
        total = len(req.prompt_tokens) + seq.generated
        if seq.chain is None:
            seq.chain = self._hashes(req.prompt_tokens, req.lora, req.mm)
        hashes = seq.chain
        n_hit = self.kv.match(hashes)
        n_private = self._blocks_for(total + 1) - len(hashes)
        ready = self.kv.ready_at(hashes[:n_hit])
        running_after = len(self.running) + 1
        load = self.load(running_after)
        cached = n_hit * cfg.block_size
        if req.remote_prefill and seq.generated == 0:
            delay = cfg.kv_transfer_overhead + len(req.prompt_tokens) * cfg.kv_transfer_per_token
        else:
            delay = (cfg.prefill_overhead + (total - cached) * cfg.prefill_per_token) * load
        t_first = max(now + delay, ready)
        extras = extra_keys(len(hashes), cfg.block_size, req.mm) if req.mm else ()
        if not self.kv.acquire(hashes, n_hit, n_private, t_first, req.prompt_tokens, req.lora, extras):
            return False
        seq.hashes, seq.n_private = hashes, n_private
        seq.state = RUNNING
        self._order += 1
        seq.order = self._order
        if seq.admitted_at is None:
            seq.admitted_at = now
            seq.cached_tokens = cached
            self.stats.prefix_queries += len(req.prompt_tokens)
            self.stats.prefix_hits += cached
            self.stats.prompt_tokens += len(req.prompt_tokens)
            for ob in self.observers:
                ob.admitted(seq, now)
        self.running.append(seq)
        self._push(seq, t_first)
        return True

    def _release(self, seq: Seq) -> None:
        self.kv.release(seq.hashes, seq.n_private)
        seq.hashes, seq.n_private = [], 0
        self.running.remove(seq)

    def _preempt(self, now: float) -> Seq:
        victim = max(self.running, key=lambda s: s.order)
        self._release(victim)
        victim.state = WAITING
        victim.gen += 1
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _emit_token(self, seq: Seq, t: float) -> None:
        cfg, req = self.cfg, seq.req
        seq.generated += 1
        self.stats.generation_tokens += 1
        if seq.first_token_at is None:
            seq.first_token_at = t
        gap = None if seq.last_token_at is None else t - seq.last_token_at
        seq.last_token_at = t
        for ob in self.observers:
            ob.token(seq, t, gap)
        self._out.append(("token", seq, t))
        limit = 1 if req.remote_decode else req.output_tokens
        if seq.generated >= limit:
            seq.state, seq.finished_at = FINISHED, t
            seq.finish_reason = "remote_decode" if req.remote_decode else req.finish_reason
            self.stats.success[seq.finish_reason] += 1
            self._release(seq)
            for ob in self.observers:
                ob.finished(seq, t)
            self._out.append(("finish", seq, t))
            self._admit(t)
            return
        # The next token needs a slot; grow by a block when crossing a block boundary.
        total = len(req.prompt_tokens) + seq.generated + 1
        while self._blocks_for(total) > len(seq.hashes) + seq.n_private:
            if self.kv.grow():
                seq.n_private += 1
                continue
            victim = self._preempt(t)
            if victim is seq:
                return
        self._push(seq, t + cfg.itl * self.load())
