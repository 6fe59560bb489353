"""The `epp` command: serve, envoy-config, explain, stack, endpoints.

Flags follow GIE's EPP where they overlap, so existing charts (and AI Runway) can start it unchanged: `epp serve`
reads its command line with Go pflag's rules and accepts every flag GIE's, llm-d's and KServe's deployments pass
(epp/cmd/pflag.py, epp/cmd/foreign.py). Each command's flags are parsed once into its typed settings (`epp serve`:
epp/cmd/settings.py); an unknown flag, a bad value, a bad combination or a missing extra is an error here (exit 2),
before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from epp.api import settings as api_settings
from epp.cmd import envoy_config
from epp.cmd.settings import ServeSettings, add_serve_flags
from epp.extras import MissingExtra
from epp.stack import settings as stack_settings

log = logging.getLogger("epp")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp", description="Pointsman: an Envoy ext_proc endpoint picker for LLMs")
    sub = p.add_subparsers(dest="command")
    add_serve_flags(sub.add_parser("serve", help="run the endpoint picker (default)"))
    envoy_config.add_flags(sub.add_parser("envoy-config", help="render an Envoy bootstrap that uses Pointsman"))
    api_settings.add_explain_flags(
        sub.add_parser("explain", help="ask a running Pointsman which endpoint a request would get, and why"))
    stack_settings.add_flags(
        sub.add_parser("stack", help="run the local stack: modelsim fleet + Pointsman + Envoy, no Docker"))
    api_settings.add_endpoints_flags(sub.add_parser("endpoints", help="list the endpoints a running Pointsman knows"))
    return p


def serve(settings: ServeSettings) -> int:
    from epp.observe.logs import configure

    configure(settings.observe.logs)  # text or --log-format json, at -v's level
    for notice in settings.compat.notices:  # other EPPs' flags that mean nothing here: once, at start
        log.warning("%s", notice)
    if settings.replicas.supervises:  # HOOK (replicas): `epp serve --workers N` runs N workers (epp/workers)
        from epp.workers import supervise

        return supervise(settings)
    from epp.cmd.app import run

    try:
        if settings.runtime.event_loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                print("error: --event-loop uvloop needs the uvloop package (pip install uvloop)", file=sys.stderr)
                return 2
            code: int = uvloop.run(run(settings))
            return code
        return asyncio.run(run(settings))
    except KeyboardInterrupt:
        return 0


def _explain(s: api_settings.ExplainSettings) -> int:
    from epp.api.client import explain_command

    return explain_command(s)


def _endpoints(s: api_settings.EndpointsSettings) -> int:
    from epp.api.client import endpoints_command

    return endpoints_command(s)


def _stack(s: stack_settings.StackSettings) -> int:
    from epp.stack.localstack import stack_command

    return stack_command(s)


# command -> (its settings from the parsed flags, what runs it)
COMMANDS: dict[str, tuple[Callable[[argparse.Namespace, list[str]], Any], Callable[[Any], int]]] = {
    "serve": (ServeSettings.from_args, serve),
    "envoy-config": (lambda ns, _: envoy_config.EnvoyConfigSettings.from_args(ns), envoy_config.envoy_config_command),
    "explain": (lambda ns, _: api_settings.ExplainSettings.from_args(ns), _explain),
    "stack": (lambda ns, _: stack_settings.StackSettings.from_args(ns), _stack),
    "endpoints": (lambda ns, _: api_settings.EndpointsSettings.from_args(ns), _endpoints),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]  # `epp --pool-name x` works like GIE's binary
    if argv[0] == "serve":  # pflag syntax and other EPPs' flags (epp/cmd/foreign.py)
        try:
            settings = ServeSettings.from_argv(argv[1:])
        except (ValueError, MissingExtra) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return serve(settings)
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command not in COMMANDS:
        parser.print_help()
        return 2
    parse, run = COMMANDS[ns.command]
    try:
        settings = parse(ns, argv)
    except (ValueError, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run(settings)


if __name__ == "__main__":
    raise SystemExit(main())
