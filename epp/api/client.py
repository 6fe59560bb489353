"""`epp explain` and `epp endpoints`: clients of Pointsman's own gRPC API."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import grpc

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.api.settings import EndpointsSettings, ExplainSettings

if TYPE_CHECKING:
    from google.protobuf.message import Message


def _stub(addr: str) -> pointsman_pb2_grpc.PointsmanStub:
    """A stub for Pointsman at `addr`: over TLS when the port serves TLS (`epp serve`'s default), trusting the
    certificate it presents as gateways do, else plaintext (`--secure-serving=false`)."""
    from epp.h2grpc import certificate_name, peer_certificate

    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    host, _, port = addr.rpartition(":")
    cert = peer_certificate(host.strip("[]") or "127.0.0.1", int(port)) if port.isdigit() else None
    if cert is None:
        return pointsman_pb2_grpc.PointsmanStub(grpc.insecure_channel(addr, options=options))
    options.append(("grpc.ssl_target_name_override", certificate_name(cert)))
    creds = grpc.ssl_channel_credentials(root_certificates=cert)
    return pointsman_pb2_grpc.PointsmanStub(grpc.secure_channel(addr, creds, options=options))


def _call(addr: str, rpc: str, request: Message) -> Any:
    """One call of the Pointsman API at `addr`; on failure the error is printed and None returned."""
    try:
        return getattr(_stub(addr), rpc)(request, timeout=10)
    except grpc.RpcError as err:
        print(f"error: cannot reach Pointsman at {addr}: {err.code().name} {err.details()}", file=sys.stderr)
        return None


def _read_body(spec: str | None) -> bytes:
    if spec is None:
        return sys.stdin.buffer.read()
    if spec.startswith("@"):
        with open(spec[1:], "rb") as f:
            return f.read()
    return spec.encode()


def receipt_command(s: ExplainSettings) -> int:
    """`epp explain --decision ID`: a past decision as it was made (epp/observe/receipts.py)."""
    from epp.api.receipts import format_receipt

    resp = _call(s.addr, "GetReceipt", api.ReceiptRequest(decision_id=s.decision))
    if resp is None:
        return 1
    if s.json:
        from google.protobuf import json_format  # only for --json
        print(json_format.MessageToJson(resp, preserving_proto_field_name=True))
    else:
        print(format_receipt(resp))
    return 0 if resp.found else 1


def explain_command(s: ExplainSettings) -> int:
    if s.decision:
        return receipt_command(s)
    req = api.ExplainRequest(path=s.path, headers=s.headers, body=_read_body(s.body), pool=s.pool)
    resp = _call(s.addr, "Explain", req)
    if resp is None:
        return 1
    if s.json:
        from google.protobuf import json_format  # only for --json
        print(json_format.MessageToJson(resp, preserving_proto_field_name=True))
        return 0 if resp.status == 200 else 1
    print(format_explain(resp))
    return 0 if resp.status == 200 else 1


def format_explain(resp: api.ExplainResponse) -> str:
    if resp.status != 200:
        queued = f"queued: it would wait in flow control's queue ({resp.queue}); if it went now, " if resp.queued else ""
        return f"{queued}status {resp.status}: {resp.error}"
    lines = [f"model {resp.model!r} -> target {resp.target_model!r}"]
    if resp.HasField("route"):
        lines.extend(format_route(resp.route))
    if resp.route.kind == "provider":
        lines.append(f"provider  {resp.route.target} (Envoy cluster {resp.route.provider_cluster})")
    else:
        lines.append(f"endpoint  {resp.endpoint}" +
                     (f"   (fallbacks: {', '.join(resp.fallbacks)})" if resp.fallbacks else ""))
    if resp.prefill:
        lines.append(f"prefill   {resp.prefill}   ({resp.decision})")
    if resp.queued:
        lines.append(f"queued    it would wait in flow control's queue ({resp.queue}); below, the pick if it went now")
    if resp.route.kind != "provider":
        lines.append(f"profile   {resp.profile}   candidates: {len(resp.candidates)}")
    if resp.token_source:
        lines.append(f"tokens    {resp.prompt_tokens} ({resp.token_source})")
    lines.extend(format_prefix(resp))
    if resp.HasField("session"):
        s = resp.session
        gap = f"{s.expected_gap_seconds:.1f}s" if s.expected_gap_seconds >= 0 else "not learnt yet"
        lines.append(f"session   {s.id} ({s.source})   turn {s.turn}{' (parallel call)' if s.parallel else ''}   "
                     f"context on {s.bound or '-'}   pause {gap}"
                     + (f"   warm {s.warm_seconds:.1f}s more" if s.warm_seconds > 0 else ""))
        lines.append(f"          {s.decision}")
    lines.extend(format_models(resp))
    for run in resp.profiles:
        lines.append(f"\n[{run.profile}] -> {', '.join(run.targets)}")
        eps = sorted(run.totals, key=lambda k: -run.totals[k]) or list(resp.candidates)
        for pl in run.plugins:
            us = pl.duration_seconds * 1e6
            if pl.kind == "filter":
                lines.append(f"  filter {pl.name:<28} kept {len(pl.kept)}  ({us:.0f} us)")
            elif pl.kind == "scorer":
                scores = "  ".join(f"{k}={pl.scores.get(k, 0):.2f}" for k in eps[:6])
                lines.append(f"  scorer {pl.name:<28} w={pl.weight:g}  {scores}  ({us:.0f} us)")
            else:
                lines.append(f"  picker {pl.name:<28} ({us:.0f} us)")
        if run.totals:
            lines.append("  total  " + "  ".join(f"{k}={run.totals[k]:.2f}" for k in eps[:6]))
    if resp.headers:
        lines.append("\nheaders set: " + ", ".join(f"{k}: {v}" for k, v in sorted(resp.headers.items())))
    return "\n".join(lines)


def format_prefix(resp: api.ExplainResponse) -> list[str]:
    """Per endpoint, the prompt blocks it holds and where that came from (events: GPU/CPU/speculative)."""
    if not resp.prefix:
        return []
    lines = ["prefix    endpoint               blocks    source"]
    for m in resp.prefix:
        held = f"{m.blocks}/{m.total_blocks}" if m.total_blocks else str(m.blocks)
        if m.source == "events":
            parts = [f"{n} {what}" for n, what in ((m.gpu_blocks, "GPU"), (m.cpu_blocks, "CPU"),
                                                    (m.speculative_blocks, "speculative")) if n]
            where = "events" + (f" ({', '.join(parts)})" if parts else "")
        else:
            where = "approximate" + (f" (index {m.index_state})" if m.index_state else "")
        lines.append(f"          {m.endpoint:<22} {held:<9} {where}")
    return lines


def format_timings(m: api.EndpointModel) -> str:
    """`engine 15.0ms+125µs/tok, 6.0ms/tok (2.1 s ago)`: the timings the latency model uses, their source and age."""
    age = f" ({m.fitted_age_seconds:.1f} s ago)" if m.fitted_age_seconds >= 0 else ""
    extra = f" ×{m.calibration:.2f}" if m.timings == "reference" else ""
    beta = f" backlog×{m.backlog_weight:.2f}" if m.backlog_weight != 1.0 else ""
    return (f"{m.timings}{extra} {m.overhead_seconds * 1e3:.1f}ms+{m.prefill_seconds_per_token * 1e6:.0f}µs/tok "
            f"{m.inter_token_seconds * 1e3:.1f}ms/tok{beta}{age}")


def format_trust(m: api.EndpointModel) -> str:
    belief = f" ×{m.hit_belief:.2f}" if m.hit_belief < 1.0 else ""
    return m.trust + belief


def format_headroom(m: api.EndpointModel) -> str:
    """The request's predicted headroom on an endpoint: objective − prediction, per objective it states."""
    parts = []
    if m.HasField("ttft_headroom_seconds"):
        parts.append(f"ttft {m.ttft_headroom_seconds * 1e3:+.0f}ms")
    if m.HasField("tpot_headroom_seconds"):
        parts.append(f"tpot {m.tpot_headroom_seconds * 1e3:+.1f}ms")
    return ", ".join(parts)


def format_models(resp: api.ExplainResponse) -> list[str]:
    """Per endpoint, the latency model's timings and trust, and what it predicted for this request."""
    if not resp.models:
        return []
    lines = []
    if resp.slo:
        placed = f" (placed as {resp.slo_class})" if resp.slo_class else ""
        lines.append(f"slo       {resp.slo}{placed}: " + ("attainable" if resp.slo_attainable
                                                          else "no endpoint predicted to meet it"))
    lines.append("model     endpoint               ttft     tpot     trust            timings")
    for m in resp.models:
        ttft = f"{m.predicted_ttft_seconds * 1e3:.0f}ms" if m.predicted_ttft_seconds >= 0 else "-"
        tpot = f"{m.predicted_tpot_seconds * 1e3:.1f}ms" if m.predicted_tpot_seconds >= 0 else "-"
        mark = (" ✓" if m.meets_slo else " ✗") if resp.slo else ""
        lines.append(f"          {m.endpoint:<22} {ttft + mark:<8} {tpot:<8} {format_trust(m):<16} "
                     f"{format_timings(m)}")
        if resp.slo and (m.HasField("ttft_headroom_seconds") or m.HasField("tpot_headroom_seconds")):
            lines.append(f"          {'':<22} headroom {format_headroom(m)}")
        if m.trust_reason:
            lines.append(f"          {'':<22} {m.trust_reason}")
    return lines


def format_route(r: api.RouteInfo) -> list[str]:
    total = sum(t.weight for t in r.split) or 1
    split = ", ".join(f"{t.target} {t.weight} ({100 * t.weight / total:.0f}%)" + (" <- picked" if t.chosen else "")
                      for t in r.split)
    lines = [f"route     {r.route}   rule {r.rule!r} (#{r.rule_index})"]
    if r.strategy and r.strategy != "weighted":  # LLMKube primary-fallback / shadow: an order, not a split
        lines.append("backends  " + ", ".join(t.target + (" <- serves" if t.chosen else "") for t in r.split))
    else:
        lines.append(f"split     {split}")
    if r.kind == "pool":
        lines.append(f"pool      {r.pool}" + (f"   engine model {r.engine_model!r}" if r.engine_model else "")
                     + (f"   session {r.session}" if r.session else ""))
    if r.rate_limit:
        lines.append(f"limits    {r.rate_limit}")
    if r.strategy:  # an LLMKube ModelRouter decision
        lines.append(f"backend   {r.backend}   strategy {r.strategy}"
                     + (f"   fallbacks {', '.join(r.fallbacks)}" if r.fallbacks else "")
                     + (f"   timeout {r.timeout}" if r.timeout else ""))
        if r.classification:
            lines.append(f"class     {r.classification}")
        if r.mirrors:
            lines.append(f"mirrors   {', '.join(r.mirrors)}")
        for note in r.notes:
            lines.append(f"note      {note}")
    for b in r.budgets:
        caps = ", ".join(x for x in (f"{b.tokens_used}/{b.max_tokens:.0f} tokens" if b.max_tokens else "",
                                     f"${b.usd_used:.4f}/${b.max_usd:g}" if b.max_usd else "") if x)
        lines.append(f"budget    {b.name}{f' [{b.scope}]' if b.scope else ''}: {caps} in {b.window_seconds:g}s "
                     f"({100 * b.utilization:.0f}% used)")
    return lines


def endpoints_command(s: EndpointsSettings) -> int:
    resp = _call(s.addr, "ListEndpoints", api.ListEndpointsRequest(pool=s.pool))
    if resp is None:
        return 1
    if s.json:
        from google.protobuf import json_format  # only for --json
        print(json_format.MessageToJson(resp, preserving_proto_field_name=True))
        return 0
    print(f"{'pool':<12} {'endpoint':<22} {'role':<8} {'wait':>4} {'run':>4} {'kv':>5} {'infl':>4} "
          f"{'metrics':<7} {'state':<8} {'fail':>4} {'trust':<16} {'timings':<44} reason")
    for e in resp.endpoints:
        metrics = "stale" if e.stale else "fresh"
        state = e.state or ("healthy" if e.routable else "out")
        fails = f"{e.consecutive_failures}/{e.failures}" if e.failures else "-"
        has_model = e.HasField("model")
        trust = format_trust(e.model) if has_model else "-"
        timings = format_timings(e.model) if has_model else "-"
        reason = "; ".join(r for r in (e.reason, e.model.trust_reason if has_model else "") if r)
        print(f"{e.pool:<12} {e.key:<22} {e.role or '-':<8} {e.waiting:>4} {e.running:>4} "
              f"{e.kv_usage:>5.2f} {e.inflight:>4} {metrics:<7} {state:<8} {fails:>4} {trust:<16} {timings:<44} "
              f"{reason}".rstrip())
    return 0
