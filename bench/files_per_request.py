"""Which files of epp/ and scheduling/ one request's path runs through.

The whole EPP runs in this process without sockets (streams_frames.in_process: each request's headers and body
are fed to `epp serve`'s application as HTTP/2 frames and routed), twice, in child processes: with 10 and with 60
requests, under a profiler that counts Python calls per file. A file whose count grows with the requests is on
the request path (start-up and shutdown run the same in both).

    .venv/bin/python bench/files_per_request.py [--endpoints-file F]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]


def count_calls(requests: int, endpoints: str) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import streams_frames

    counts: collections.Counter[str] = collections.Counter()
    mine = (str(ROOT / "epp") + "/", str(ROOT / "scheduling") + "/")

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(mine):
            counts[str(Path(frame.f_code.co_filename).relative_to(ROOT))] += 1

    sys.setprofile(profile)
    asyncio.run(streams_frames.in_process(0, requests, endpoints, []))
    sys.setprofile(None)
    print(json.dumps(counts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints-file", default=str(ROOT / "envoy" / "endpoints.example.yaml"))
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        count_calls(a.child, a.endpoints_file)
        return 0
    few, many = (json.loads(subprocess.run([sys.executable, __file__, "--child", str(n), "--endpoints-file",
                                            a.endpoints_file], capture_output=True, text=True,
                                           check=True).stdout.splitlines()[-1]) for n in (10, 60))
    path = sorted(f for f in many if many[f] > few.get(f, 0))
    print(f"{len(path)} files on the request path (calls per 50 requests beside each)")
    for f in path:
        print(f"  {f} {many[f] - few.get(f, 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
