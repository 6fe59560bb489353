"""What envoy-data-plane costs to import, next to the request path, measured in fresh interpreters.

Each case runs in its own `python -c` (so nothing is cached in-process; .pyc files are warm after a first
untimed round), timing only the statement itself with perf_counter, plus the peak RSS of the process. Cases are
interleaved round by round (the machine is noisy) and medians are printed as a markdown table, with each case's
time as a ratio to the request path's imports.

    .venv/bin/python bench/bench_import_cost.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES: dict[str, tuple[str, str]] = {
    # name: (setup, timed statement)
    "request path: epp.extproc.server + director + protocol": ("", "import epp.extproc.server, epp.request.director, epp.protocol"),
    "serve path: epp.cmd.app + epp.cmd.cli + epp.xds (EDS, upb)": ("", "import epp.cmd.app, epp.cmd.cli, epp.xds"),
    "epp.envoy_config (spec only)": ("", "import epp.envoy_config"),
    "envoy_data_plane bootstrap.v3 (typed classes)": ("", "import envoy_data_plane.envoy.config.bootstrap.v3"),
    "first render_yaml(--eds): imports + build": (
        "from epp.envoy_config import EnvoyConfigSpec, render_yaml",
        "render_yaml(EnvoyConfigSpec(variant='override-host', eds=True))"),
    "second render_yaml(--eds): build only": (
        "from epp.envoy_config import EnvoyConfigSpec, render_yaml; "
        "render_yaml(EnvoyConfigSpec(variant='override-host', eds=True))",
        "render_yaml(EnvoyConfigSpec(variant='override-host', eds=True))"),
}

PROBE = """
import resource, sys, time
{setup}
t = time.perf_counter()
{stmt}
dt = time.perf_counter() - t
print(__import__("json").dumps({{"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def run_case(setup: str, stmt: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup, stmt=stmt)], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cli() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "epp.cmd.cli", "envoy-config", "--eds", "-o", "/dev/null"], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    return time.perf_counter() - t


def run_bare() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    for setup, stmt in CASES.values():  # warm .pyc files; not timed
        run_case(setup, stmt)
    times: dict[str, list[float]] = {k: [] for k in CASES}
    rss: dict[str, list[float]] = {k: [] for k in CASES}
    cli: list[float] = []
    bare: list[float] = []
    for _ in range(args.rounds):
        for name, (setup, stmt) in CASES.items():
            r = run_case(setup, stmt)
            times[name].append(r["s"])
            rss[name].append(r["rss_mb"])
        cli.append(run_cli())
        bare.append(run_bare())
    base = statistics.median(times[next(iter(CASES))])
    print(f"median of {args.rounds} interleaved rounds, fresh interpreter each (python {sys.version.split()[0]})\n")
    print("| case | median ms | ratio to request path | peak RSS MB |")
    print("|---|---:|---:|---:|")
    for name in CASES:
        med = statistics.median(times[name])
        print(f"| {name} | {med * 1000:.0f} | {med / base:.1f}x | {statistics.median(rss[name]):.0f} |")
    print(f"| `epp envoy-config --eds` whole process (wall) | {statistics.median(cli) * 1000:.0f} | "
          f"{statistics.median(cli) / base:.1f}x | |")
    print(f"| `python -c pass` (interpreter start, wall) | {statistics.median(bare) * 1000:.0f} | "
          f"{statistics.median(bare) / base:.1f}x | |")


if __name__ == "__main__":
    main()
