"""The benchmarks that borrow the tests' fixtures still start: each answers --help (it imports everything it uses
first). bench_failopen takes no flags and runs at once, and streams_frames is a module of bench_streams."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["bench_scrape.py", "bench_ratelimit.py", "bench_scaling.py"])
def test_a_benchmark_using_the_tests_fixtures_starts(script: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
