"""`modelsim`: serve N simulated vLLM servers on consecutive ports from one process.

Example: modelsim --servers 4 --base-port 8100 --model meta-llama/Llama-3.1-8B --time-scale 0.1
Flags override the values of --config (YAML: fleet keys at top level, engine keys at top level or under
`engine:`; dashes or underscores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from modelsim.config import fleet_from_mapping, load_fleet_file

# flag -> (config key, type, help). Durations on the command line are in ms / µs for readability.
_FLEET_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--servers": ("servers", int, "number of servers (default 1)"),
    "--host": ("host", str, "listen address (default 127.0.0.1)"),
    "--base-port": ("base_port", int, "port of server 0; server i listens on base-port + i (default 8100)"),
    "--model": ("model", str, "served base model name (default meta-llama/Llama-3.1-8B)"),
    "--time-scale": ("time_scale", float, "wall seconds per model second; 0.1 runs 10x faster (default 1.0)"),
    "--failure-rate": ("failure_rate", float, "fraction of requests failing with 429/500/503 (default 0)"),
    "--seed": ("seed", int, "RNG seed for failure injection (default 0)"),
    "--kv-events-port": ("kv_events_port", int, "enable ZMQ KV events; server i publishes on this + i"),
    "--kv-events-replay-port": ("kv_events_replay_port", int, "replay ROUTER socket of server i on this + i"),
    "--kv-events-encoding": ("kv_events_encoding", str, "event encoding: array (vLLM <= 0.23, default) or map"),
    "--kv-events-style": ("kv_events_style", str, "event style: vllm (default) or sglang (one event per block)"),
    "--kv-events-hash-format": ("kv_events_hash_format", str, "block hashes as int (default) or bytes"),
    "--kv-events-buffer-steps": ("kv_events_buffer_steps", int, "batches retained for replay (default 10000)"),
    "--tokenizer": ("tokenizer", str, "tokenize with this Hugging Face tokenizer dir (tokenizer.json + chat "
                                      "template) instead of the byte tokenizer"),
    "--oracle-port": ("oracle_port", int, "serve an in-process oracle router over the fleet on this port"),
    "--stream-interval-ms": ("stream_interval", float, "coalesce streamed tokens after the first: wall ms"),
    "--engine-type": ("engine_type", str, "whose metrics to expose: vllm (default) or sglang"),
    "--metrics-time": ("metrics_time", str, "latency histograms in model seconds (default) or wall seconds"),
    "--request-log-size": ("request_log_size", int, "finished requests kept for GET /admin/requests (10000)"),
}
_ENGINE_FLAGS: dict[str, tuple[str, Any, float, str]] = {
    "--max-num-seqs": ("max_num_seqs", int, 1, "concurrent running requests (default 16)"),
    "--max-waiting": ("max_waiting", int, 1, "waiting-queue limit; past it 429 (default 1000)"),
    "--kv-cache-size": ("kv_cache_size", int, 1, "KV cache blocks (default 1024)"),
    "--block-size": ("block_size", int, 1, "tokens per KV block (default 16)"),
    "--max-model-len": ("max_model_len", int, 1, "context length (default 32768)"),
    "--max-loras": ("max_loras", int, 1, "LoRA adapters active at once (default 1)"),
    "--default-max-tokens": ("default_max_tokens", int, 1, "output length when max_tokens is absent (16)"),
    "--itl-ms": ("itl", float, 1e-3, "inter-token latency, ms (default 12)"),
    "--prefill-overhead-ms": ("prefill_overhead", float, 1e-3, "prefill overhead, ms (default 30)"),
    "--prefill-per-token-us": ("prefill_per_token", float, 1e-6, "prefill per uncached token, µs (250)"),
    "--load-factor": ("load_factor", float, 1, "latency factor F at max-num-seqs running (default 2.0)"),
    "--kv-transfer-overhead-ms": ("kv_transfer_overhead", float, 1e-3, "P/D KV transfer overhead, ms (5)"),
    "--kv-transfer-per-token-us": ("kv_transfer_per_token", float, 1e-6, "P/D transfer per token, µs (10)"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="modelsim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config file; flags override it")
    for flag, (_, typ, hlp) in _FLEET_FLAGS.items():
        ap.add_argument(flag, type=typ, help=hlp)
    ap.add_argument("--lora", action="append", default=None,
                    help="a LoRA adapter served besides the base model (repeatable, or comma list)")
    ap.add_argument("--roles", help="comma list of per-server roles: both, prefill, decode")
    ap.add_argument("--engine", dest="engine_type", help="alias of --engine-type")
    ap.add_argument("--latency-factors", help="comma list, one per server: every engine duration is multiplied "
                                              "by it (2 = a server twice as slow)")
    ap.add_argument("--ports", help="comma list of one port per server (instead of consecutive --base-port ports)")
    ap.add_argument("--kv-events-ports", help="comma list of one KV-event PUB port per server (instead of "
                                              "--kv-events-port + i)")
    ap.add_argument("--kv-events-replay-ports", help="comma list of one replay port per server (instead of "
                                                     "--kv-events-replay-port + i)")
    for flag, (_, typ, _, hlp) in _ENGINE_FLAGS.items():
        ap.add_argument(flag, type=typ, help=hlp)
    ap.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    return ap


def config_from_args(args: argparse.Namespace) -> Any:
    data: dict[str, Any] = load_fleet_file(args.config) if args.config else {}
    engine = dict(data.pop("engine", None) or {})
    for flag, (key, _, _) in _FLEET_FLAGS.items():
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None:
            data[key] = v / 1000.0 if key == "stream_interval" else v
    if args.lora:
        data["loras"] = [x for item in args.lora for x in item.split(",") if x]
    if args.roles:
        data["roles"] = args.roles.split(",")
    if args.latency_factors:
        data["latency_factors"] = args.latency_factors
    if args.ports:
        data["ports"] = args.ports
    if args.kv_events_ports:
        data["kv_events_ports"] = args.kv_events_ports
    if args.kv_events_replay_ports:
        data["kv_events_replay_ports"] = args.kv_events_replay_ports
    for flag, (key, _, mult, _) in _ENGINE_FLAGS.items():
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None:
            engine[key] = v * mult if mult != 1 else v
    if args.no_prefix_caching:
        engine["enable_prefix_caching"] = False
    data["engine"] = engine
    return fleet_from_mapping(data, args.config or "<flags>")


async def serve(config: Any, ready_line: bool = True) -> None:
    from modelsim.fleet import Fleet

    fleet = Fleet(config)
    await fleet.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if ready_line:
        ports = ",".join(str(s.port) for s in fleet.servers)
        print(f"modelsim ready: {config.servers} server(s) on {config.host} ports {ports} "
              f"model={config.model} time_scale={config.time_scale}", flush=True)
    try:
        await stop.wait()
    finally:
        await fleet.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from epp.extras import MissingExtra, check

    try:
        check("stack", "modelsim", ("msgpack", "zmq"))  # the simulated engines' KV events
    except MissingExtra as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"modelsim: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        print(f"modelsim: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
