from __future__ import annotations

from pathlib import Path

import pytest

from modelsim.cli import build_parser, config_from_args, main


def test_flags_map_to_config_with_units() -> None:
    args = build_parser().parse_args([
        "--servers", "3", "--base-port", "9000", "--time-scale", "0.1", "--itl-ms", "20",
        "--prefill-per-token-us", "100", "--lora", "a,b", "--lora", "c", "--kv-cache-size", "64",
        "--stream-interval-ms", "5",
    ])
    cfg = config_from_args(args)
    assert cfg.servers == 3 and cfg.port(2) == 9002 and cfg.time_scale == 0.1
    assert cfg.engine.itl == pytest.approx(0.020) and cfg.engine.prefill_per_token == pytest.approx(1e-4)
    assert cfg.loras == ("a", "b", "c") and cfg.engine.kv_cache_size == 64
    assert cfg.stream_interval == pytest.approx(0.005)


def test_yaml_file_and_flag_override(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text("servers: 2\nmodel: m\nengine:\n  max-num-seqs: 4\n  itl: 0.02\nblock_size: 32\n")
    cfg = config_from_args(build_parser().parse_args(["--config", str(f), "--servers", "5"]))
    assert cfg.servers == 5 and cfg.model == "m"
    assert cfg.engine.max_num_seqs == 4 and cfg.engine.itl == 0.02 and cfg.engine.block_size == 32


def test_bad_config_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("servers: 2\nwarp_speed: 9\n")
    assert main(["--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "warp_speed" in err and str(f) in err
    assert main(["--time-scale", "0"]) == 2


def test_engine_flavour_metrics_clock_and_latency_factors_flags(tmp_path: Path) -> None:
    cfg = config_from_args(build_parser().parse_args([
        "--servers", "3", "--engine", "sglang", "--metrics-time", "wall", "--latency-factors", "1,2,0.5",
        "--request-log-size", "7",
    ]))
    assert cfg.engine_type == "sglang" and cfg.metrics_time == "wall" and cfg.request_log_size == 7
    assert cfg.latency_factors == (1.0, 2.0, 0.5) and cfg.engine_for(2).itl == pytest.approx(0.006)
    f = tmp_path / "fleet.yaml"
    f.write_text("servers: 2\nengine-type: sglang\nlatency-factors: [1, 2]\n")
    cfg = config_from_args(build_parser().parse_args(["--config", str(f)]))
    assert cfg.engine_type == "sglang" and cfg.latency_factors == (1.0, 2.0)
    assert main(["--servers", "2", "--latency-factors", "1,x"]) == 2
    assert main(["--engine-type", "tgi"]) == 2
