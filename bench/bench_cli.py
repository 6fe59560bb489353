"""How fast the `epp` client commands answer, as a ratio to `python -c pass` measured in the same run.

A real `epp serve` (an endpoints file, TLS on its gRPC port as by default) runs for `epp endpoints` to ask; each
command then runs in a fresh interpreter (`python -m epp.cmd.cli ...`, what the `epp` script runs), round after
round, interleaved with `python -c pass` (the machine is shared and noisy: only the ratio travels), after one
untimed round that warms the .pyc files. Each case's modules are counted once (`len(sys.modules)` at exit).
Medians are printed as a markdown table.

    .venv/bin/python bench/bench_cli.py --rounds 11
    .venv/bin/python bench/bench_cli.py --compare /tmp/older-checkout   # and another tree, in the same rounds

Issue 29's target: `epp endpoints` answers in 0.3 s or less on the project's machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ENDPOINTS = "pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n  - {address: 127.0.0.1, port: 2}\n"

# name -> the `epp` arguments ({addr}: the running server's gRPC address); None is `python -c pass`
CASES: dict[str, list[str] | None] = {
    "python -c pass": None,
    "epp endpoints": ["endpoints", "--addr", "{addr}"],
    "epp explain --help": ["explain", "--help"],
    "epp serve --help": ["serve", "--help"],
    "epp envoy-config": ["envoy-config", "-o", os.devnull],
}

COUNT = ("import atexit, sys\n"
         "atexit.register(lambda: print('MODULES', len(sys.modules), file=sys.stderr))\n"
         "from epp.cmd.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def argv(case: list[str] | None, addr: str) -> list[str]:
    if case is None:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-m", "epp.cmd.cli", *(a.format(addr=addr) for a in case)]


def run(cmd: list[str], root: Path) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - t


def modules(case: list[str] | None, addr: str, root: Path) -> int:
    if case is None:
        cmd = [sys.executable, "-c", "import sys; print('MODULES', len(sys.modules), file=sys.stderr)"]
    else:
        cmd = [sys.executable, "-c", COUNT, *(a.format(addr=addr) for a in case)]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    counts = [line.split()[1] for line in out.stderr.splitlines() if line.startswith("MODULES ")]
    return int(counts[-1])


def start_server(root: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    workdir.mkdir(parents=True, exist_ok=True)
    eps = workdir / "endpoints.yaml"
    eps.write_text(ENDPOINTS)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "epp.cmd.cli", "serve", "--endpoints-file", str(eps),
                               "--grpc-host", "127.0.0.1", "--grpc-port", str(port), "--grpc-health-port", "0",
                               "--metrics-port", "0"], cwd=root, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    addr = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"epp serve exited with {server.returncode}")
        ask = subprocess.run(argv(CASES["epp endpoints"], addr), cwd=root, capture_output=True, timeout=60)
        if ask.returncode == 0:
            return server, addr
        time.sleep(0.2)
    server.kill()
    raise SystemExit("epp serve did not answer `epp endpoints` within 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (its epp/ is imported)")
    ap.add_argument("--compare", type=Path, default=None,
                    help="another checkout (e.g. an older commit's `git archive`), measured in the same rounds with "
                         "this interpreter")
    args = ap.parse_args()
    roots = [args.root.resolve(), *([args.compare.resolve()] if args.compare else [])]
    with tempfile.TemporaryDirectory() as tmp:
        servers = [start_server(root, Path(tmp) / str(i)) for i, root in enumerate(roots)]
        try:
            cases = [(root, addr, name, case) for root, (_, addr) in zip(roots, servers, strict=True)
                     for name, case in CASES.items()]
            for root, addr, _, case in cases:  # warm the .pyc files; not timed
                run(argv(case, addr), root)
            times: dict[tuple[Path, str], list[float]] = {(root, name): [] for root, _, name, _ in cases}
            for _ in range(args.rounds):
                for root, addr, name, case in cases:
                    times[root, name].append(run(argv(case, addr), root))
            counts = {(root, name): modules(case, addr, root) for root, addr, name, case in cases}
        finally:
            for server, _ in servers:
                server.terminate()
                server.wait(timeout=30)
    print(f"median of {args.rounds} interleaved rounds, a fresh interpreter each (python {sys.version.split()[0]})\n")
    for root in roots:
        base = statistics.median(times[root, "python -c pass"])
        print(f"{root}\n")
        print("| command | median s | ratio to `python -c pass` | modules loaded |")
        print("|---|---:|---:|---:|")
        for name in CASES:
            med = statistics.median(times[root, name])
            print(f"| `{name}` | {med:.3f} | {med / base:.1f}x | {counts[root, name]} |")
        print()


if __name__ == "__main__":
    main()
