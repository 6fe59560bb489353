"""`epp serve`: wires the datastore, sources, scheduler, director and servers together, then runs until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from epp.datastore import Datastore
from epp.director import Director, DirectorConfig
from epp.server import StreamConfig, build_server

log = logging.getLogger("epp")


def load_scheduling(args: argparse.Namespace, rng: random.Random) -> Any:
    """The scheduler from --config-text / --config-file, or the built-in default profile."""
    from scheduling.config import load_scheduler, parse_yaml

    timer = time.perf_counter
    if args.config_text:
        docs = [d.data for d in parse_yaml(args.config_text, "--config-text")]
        return load_scheduler(docs, rng=rng, timer=timer, name="--config-text")
    if args.config_file:
        return load_scheduler(Path(args.config_file), rng=rng, timer=timer)
    return load_scheduler(None, rng=rng, timer=timer)


class App:
    """Everything `epp serve` runs; tests start it in-process with the same flags."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.datastore = Datastore(default_pool=args.pool_name)
        self.tasks: list[asyncio.Task[Any]] = []
        self.cleanups: list[Callable[[], Awaitable[None]]] = []
        self.server: Any = None
        self.port = 0

    async def start(self) -> None:
        args = self.args
        if args.endpoints_file:
            from epp.static_source import load_static_file

            load_static_file(args.endpoints_file, self.datastore)
        scheduler = load_scheduling(args, self.rng)
        cfg = DirectorConfig(
            model_header=args.model_header,
            base_model_header=args.base_model_header,
            ai_gateway_model_header=args.ai_gateway_model_header or None,
            fallbacks=args.fallbacks,
            conformance=args.enable_conformance_header,
            default_pool=args.pool_name,
            log_decisions=args.log_decisions,
        )
        self.director = Director(self.datastore, scheduler, cfg, rng=self.rng)
        stream_cfg = StreamConfig(args.request_body_mode, args.response_body_mode, args.max_body_bytes)
        self.server, self.extproc = build_server(self.director, stream_cfg)
        addr = f"{args.grpc_host}:{args.grpc_port}"
        self.port = self.server.add_insecure_port(addr)
        if not self.port:
            raise RuntimeError(f"cannot bind the gRPC port {addr}")
        await self.server.start()
        log.info("Pointsman serving ext_proc on %s:%d", args.grpc_host, self.port)

    async def stop(self, grace: float = 5.0) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for fn in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                await fn()
        if self.server is not None:
            await self.server.stop(grace)


async def run(args: argparse.Namespace) -> int:
    app = App(args)
    try:
        await app.start()
    except Exception as e:
        log.error("cannot start: %s", e)
        await app.stop(0)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight streams")
    await app.stop(grace=10.0)
    return 0
