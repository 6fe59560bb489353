"""Summaries, the markdown table and PNG plots for the routing benchmark."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(regime: str, router: str, qps: float, results: list[Result], elapsed: float, resets: int = 0) -> Row:
    """Latency, hit rate and errors of the requests that went through the router (those sent straight to the
    servers are counted in `direct`); output tokens/s of all of them (what the fleet delivered)."""
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
    return Row(regime, router, qps, len(results), len(errs), percentile(ttfts, 0.5), percentile(ttfts, 0.9),
               percentile(e2es, 0.5), percentile(e2es, 0.9), out / elapsed if elapsed > 0 else 0.0,
               cached / prompt if prompt else 0.0, (errs[0].error[:120] if errs else ""), len(direct), resets)


def _f(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(rows: list[Row], header: str = "") -> str:
    lines = [header] if header else []
    lines += ["| regime | router | QPS | reqs | err | TTFT p50 s | TTFT p90 s | e2e p50 s | e2e p90 s | out tok/s "
              "| prefix hit |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.regime} | {r.router} | {r.qps:g} | {r.requests} | {r.errors} | {_f(r.ttft_p50)} | "
                     f"{_f(r.ttft_p90)} | {_f(r.e2e_p50)} | {_f(r.e2e_p90)} | {r.output_tok_s:.0f} | "
                     f"{100 * r.hit_rate:.1f}% |")
    return "\n".join(lines) + "\n"


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
