"""Summaries, the markdown table and PNG plots for the routing benchmark."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.routing.client import Result


@dataclass
class Row:
    regime: str
    router: str
    qps: float
    requests: int
    errors: int
    ttft_p50: float | None
    ttft_p90: float | None
    e2e_p50: float | None
    e2e_p90: float | None
    output_tok_s: float
    hit_rate: float  # cached prompt tokens / prompt tokens
    error_sample: str = ""
    direct: int = 0  # requests sent straight to the servers (not in the latency and hit columns)
    resets: int = 0  # prefix-cache resets during the stage
    sample: int = 0  # the workload seed
    ttft_p50_all: float | None = None  # routed and direct requests together (outside traffic)
    ttft_p90_all: float | None = None
    slo_requests: int = 0  # routed requests carrying a TTFT SLO
    slo_tight: int = 0  # of which in the tightest class
    slo_attain_all: float | None = None  # share of them meeting their SLOs (errors miss)
    slo_attain_tight: float | None = None
    goodput: float | None = None  # routed requests meeting their SLOs per model second
    ttft_p50_tight: float | None = None  # TTFT of the tightest class's requests that succeeded, and of the others
    ttft_p90_tight: float | None = None
    ttft_p50_loose: float | None = None
    ttft_p90_loose: float | None = None
    tight_missed_ttft: int = 0  # tight requests that failed or missed their TTFT SLO
    tight_missed_tpot: int = 0  # tight requests within their TTFT SLO that missed only their TPOT SLO
    tight_missed_at: list[float] = field(default_factory=list)  # when each missed tight request arrived (model s)
    # the routed requests' TTFT as their engines recorded it, and the client's TTFT minus it: the way to the engine
    # and back, the router's hop included (model seconds; None when the engines keep no records)
    engine_ttft_p50: float | None = None
    engine_ttft_p90: float | None = None
    hop_p50: float | None = None
    hop_p90: float | None = None


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(regime: str, router: str, qps: float, results: list[Result], elapsed: float, resets: int = 0,
              sample: int = 0) -> Row:
    """Latency, hit rate, errors and SLO attainment of the requests that went through the router (those sent
    straight to the servers are counted in `direct`, and in the `_all` TTFT percentiles); output tokens/s of all of
    them (what the fleet delivered)."""
    all_ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
    direct = [r for r in results if r.direct]
    out = sum(r.output_tokens for r in direct if r.status == 200)
    results = [r for r in results if not r.direct]
    ok = [r for r in results if r.status == 200 and r.ttft is not None]
    errs = [r for r in results if not (r.status == 200 and r.ttft is not None)]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    out += sum(r.output_tokens for r in ok)
    row = Row(regime, router, qps, len(results), len(errs), percentile(ttfts, 0.5), percentile(ttfts, 0.9),
              percentile(e2es, 0.5), percentile(e2es, 0.9), out / elapsed if elapsed > 0 else 0.0,
              cached / prompt if prompt else 0.0, (errs[0].error[:120] if errs else ""), len(direct), resets, sample)
    if direct:
        row.ttft_p50_all, row.ttft_p90_all = percentile(all_ttfts, 0.5), percentile(all_ttfts, 0.9)
    paired = [(r.ttft, r.engine_ttft) for r in ok if r.ttft is not None and r.engine_ttft is not None]
    if paired:
        engine = [e for _, e in paired]
        hops = [t - e for t, e in paired]
        row.engine_ttft_p50, row.engine_ttft_p90 = percentile(engine, 0.5), percentile(engine, 0.9)
        row.hop_p50, row.hop_p90 = percentile(hops, 0.5), percentile(hops, 0.9)
    slo = [r for r in results if r.slo_ttft is not None]
    if slo:
        tight = [r for r in slo if r.tight]
        met = sum(1 for r in slo if r.met_slo)
        row.slo_requests, row.slo_tight = len(slo), len(tight)
        row.slo_attain_all = met / len(slo)
        row.slo_attain_tight = sum(1 for r in tight if r.met_slo) / len(tight) if tight else None
        row.goodput = met / elapsed if elapsed > 0 else 0.0
        t_ttfts = [r.ttft for r in tight if r.ok and r.ttft is not None]
        l_ttfts = [r.ttft for r in slo if not r.tight and r.ok and r.ttft is not None]
        row.ttft_p50_tight, row.ttft_p90_tight = percentile(t_ttfts, 0.5), percentile(t_ttfts, 0.9)
        late = [r for r in tight if not r.met_slo]
        row.tight_missed_ttft = sum(1 for r in late if not r.met_ttft)
        row.tight_missed_tpot = len(late) - row.tight_missed_ttft
        row.tight_missed_at = sorted(round(r.at, 2) for r in late)
        row.ttft_p50_loose, row.ttft_p90_loose = percentile(l_ttfts, 0.5), percentile(l_ttfts, 0.9)
    return row


def _f(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(rows: list[Row], header: str = "") -> str:
    lines = [header] if header else []
    lines += ["| regime | router | QPS | reqs | err | TTFT p50 s | TTFT p90 s | e2e p50 s | e2e p90 s | out tok/s "
              "| prefix hit |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    samples = len({r.sample for r in rows}) > 1
    if samples:
        lines[-2:] = [lines[-2].replace("| QPS |", "| sample | QPS |"), lines[-1].replace("|---:|", "|---:|---:|", 1)]
    for r in rows:
        lines.append(f"| {r.regime} | {r.router} | {f'{r.sample} | ' if samples else ''}{r.qps:g} | {r.requests} | "
                     f"{r.errors} | {_f(r.ttft_p50)} | {_f(r.ttft_p90)} | {_f(r.e2e_p50)} | {_f(r.e2e_p90)} | "
                     f"{r.output_tok_s:.0f} | {100 * r.hit_rate:.1f}% |")
    out = "\n".join(lines) + "\n"
    outside = [r for r in rows if r.direct]
    if outside:
        out += ("\nRequests that bypassed the router (TTFT of the routed requests and of all):\n\n"
                "| regime | router | sample | QPS | direct | routed TTFT p50 / p90 s | all TTFT p50 / p90 s |\n"
                "|---|---|---:|---:|---:|---:|---:|\n")
        out += "".join(f"| {r.regime} | {r.router} | {r.sample} | {r.qps:g} | {r.direct} | {_f(r.ttft_p50)} / "
                       f"{_f(r.ttft_p90)} | {_f(r.ttft_p50_all)} / {_f(r.ttft_p90_all)} |\n" for r in outside)
    hop = [r for r in rows if r.hop_p50 is not None]
    if hop:
        out += ("\nWhere the TTFT was spent: at the engine (its own record, from the request's arrival there to its "
                "first token) and on the way there and back (the client's TTFT minus the engine's: the router's hop, "
                "the proxies and the network), routed requests:\n\n"
                "| regime | router | sample | QPS | TTFT p50 / p90 s | engine TTFT p50 / p90 s | hop p50 / p90 ms |\n"
                "|---|---|---:|---:|---:|---:|---:|\n")
        out += "".join(f"| {r.regime} | {r.router} | {r.sample} | {r.qps:g} | {_f(r.ttft_p50)} / {_f(r.ttft_p90)} | "
                       f"{_f(r.engine_ttft_p50)} / {_f(r.engine_ttft_p90)} | {_ms(r.hop_p50)} / {_ms(r.hop_p90)} |\n"
                       for r in hop)
    slo = [r for r in rows if r.slo_requests]
    if slo:
        out += ("\nSLO attainment (share of the routed requests meeting their SLOs; errors miss), next to each "
                "class's TTFT p50 / p90 (the tightest class, the others) and goodput (requests meeting their SLOs "
                "per model second):\n\n"
                "| regime | router | sample | QPS | reqs (tight) | tight met | all met | tight TTFT p50 / p90 s | "
                "loose TTFT p50 / p90 s | goodput req/s | tight missed: TTFT / TPOT only |\n"
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
        out += "".join(f"| {r.regime} | {r.router} | {r.sample} | {r.qps:g} | {r.slo_requests} ({r.slo_tight}) | "
                       f"{_pct(r.slo_attain_tight)} | {_pct(r.slo_attain_all)} | {_f(r.ttft_p50_tight)} / "
                       f"{_f(r.ttft_p90_tight)} | {_f(r.ttft_p50_loose)} / {_f(r.ttft_p90_loose)} | "
                       f"{_f(r.goodput, 2)} | {r.tight_missed_ttft} / {r.tight_missed_tpot} |\n" for r in slo)
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def write_outputs(rows: list[Row], out_dir: Path, header: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.md", out_dir / "results.json"]
    paths[0].write_text(markdown(rows, header))
    paths[1].write_text(json.dumps([asdict(r) for r in rows], indent=1))
    try:
        paths += plot(rows, out_dir)
    except ImportError:
        print("no plots: matplotlib is not installed (pip install -e '.[bench]')", flush=True)
    return paths


def plot(rows: list[Row], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for regime in sorted({r.regime for r in rows}):
        rs = [r for r in rows if r.regime == regime]
        if len({r.sample for r in rs}) > 1 or len({r.qps for r in rs}) < 2:
            continue  # workload samples or a single stage: the table says it all
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for router in sorted({r.router for r in rs}):
            pts = sorted((r for r in rs if r.router == router), key=lambda r: r.qps)
            q = [r.qps for r in pts]
            axes[0].plot(q, [r.ttft_p90 if r.ttft_p90 is not None else float("nan") for r in pts], "o-",
                         label=router)
            axes[1].plot(q, [r.output_tok_s for r in pts], "o-", label=router)
            axes[2].plot(q, [100 * r.hit_rate for r in pts], "o-", label=router)
        for ax, title in zip(axes, ("TTFT p90 (model s)", "output tokens/s (model)", "prefix-hit rate %"), strict=True):
            ax.set_title(f"{regime}: {title}")
            ax.set_xlabel("QPS (model time)")
            ax.grid(alpha=0.3)
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / f"{regime}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    return written
