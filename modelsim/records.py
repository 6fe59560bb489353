"""The simulator's own record of every request it finished: the ground truth a timing learner is checked against.

`RequestLog` is an engine observer. When a request finishes (or is aborted) it appends one record with the
request's exact model-time timeline, as the engine computed it (no wall-clock noise), to a bounded ring.
`GET /admin/requests[?since=N]` serves them (see modelsim.admin).

Record fields (seconds are model seconds; multiply by the fleet's time scale for wall seconds):
    seq             1, 2, ... in finishing order (the ring forgets the oldest past its size)
    request_id      the x-request-id header, or a generated id
    arrival, admitted, first_token, finished      absolute model times (admitted/first_token may be None)
    queue           admitted − arrival                (vLLM's request_queue_time)
    ttft            first_token − arrival
    prefill         first_token − admitted            (vLLM's request_prefill_time)
    decode          finished − first_token            (vLLM's request_decode_time)
    inference       finished − admitted               (vLLM's request_inference_time)
    e2e             finished − arrival
    tpot            decode / (output_tokens − 1), 0 for a single token (vLLM's request_time_per_output_token)
    itl_sum, itl_count      the gaps between consecutive tokens (vLLM's inter_token_latency observations)
    prompt_tokens, cached_tokens, output_tokens, finish_reason ("abort" when cancelled), preemptions
"""

from __future__ import annotations

from collections import deque
from typing import Any

from modelsim.engine import Seq


def timeline(seq: Seq) -> dict[str, float | None]:
    """The derived durations of a finished request (None where the request never got that far)."""
    a, adm, first, fin = seq.arrival, seq.admitted_at, seq.first_token_at, seq.finished_at
    n = seq.generated

    def d(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else y - x

    decode = d(first, fin) if first is not None else None
    return {"queue": d(a, adm), "ttft": d(a, first), "prefill": d(adm, first), "decode": decode,
            "inference": d(adm, fin) if first is not None else None, "e2e": d(a, fin),
            "tpot": (decode / (n - 1) if n > 1 else 0.0) if decode is not None else None}


class RequestLog:
    """Bounded ring of finished-request records (an EngineObserver)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.records: deque[dict[str, Any]] = deque(maxlen=max(1, size))
        self.seq = 0
        self._itl: dict[int, list[float]] = {}  # id(seq) -> [sum, count] while the request runs

    def admitted(self, seq: Seq, now: float) -> None:
        pass

    def token(self, seq: Seq, t: float, gap: float | None) -> None:
        if gap is not None:
            acc = self._itl.setdefault(id(seq), [0.0, 0.0])
            acc[0] += gap
            acc[1] += 1

    def finished(self, seq: Seq, t: float) -> None:
        self._record(seq)

    def aborted(self, seq: Seq, now: float) -> None:
        self._record(seq)

    def _record(self, seq: Seq) -> None:
        itl = self._itl.pop(id(seq), [0.0, 0.0])
        if self.size <= 0:
            return
        self.seq += 1
        self.records.append({
            "seq": self.seq, "request_id": seq.req.request_id, "arrival": seq.arrival, "admitted": seq.admitted_at,
            "first_token": seq.first_token_at, "finished": seq.finished_at, **timeline(seq),
            "itl_sum": itl[0], "itl_count": int(itl[1]), "prompt_tokens": len(seq.req.prompt_tokens),
            "cached_tokens": seq.cached_tokens, "output_tokens": seq.generated,
            "finish_reason": seq.finish_reason, "preemptions": seq.preemptions,
        })

    def since(self, after: int) -> list[dict[str, Any]]:
        """Records with seq > `after` that the ring still holds, oldest first."""
        if after <= 0:
            return list(self.records)
        return [r for r in self.records if r["seq"] > after]
