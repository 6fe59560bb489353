"""The `epp` command: serve, envoy-config, explain, stack, endpoints, kv-relay.

Flags follow GIE's EPP where they overlap, so existing charts (and AI Runway) can start it unchanged: `epp serve`
reads its command line with Go pflag's rules and accepts every flag GIE's, llm-d's and KServe's deployments pass
(epp/cmd/pflag.py, epp/cmd/foreign.py). Each command's flags are parsed once into its typed settings (`epp serve`:
epp/cmd/settings.py); an unknown flag, a bad value, a bad combination or a missing extra is an error here (exit 2),
before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epp.extras import MissingExtra

if TYPE_CHECKING:
    from epp.api.settings import EndpointsSettings, ExplainSettings
    from epp.cmd.envoy_config import EnvoyConfigSettings
    from epp.cmd.settings import ServeSettings
    from epp.fleet.kvevents.settings import RelaySettings
    from epp.stack.settings import StackSettings

log = logging.getLogger("epp")


@dataclass(frozen=True)
class Command:
    """One `epp` command. Its flags, settings and code are imported only when it runs (or when its flags are built),
    so a client command loads what it uses and no more (`epp endpoints` does not import the server)."""

    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    settings: Callable[[argparse.Namespace, list[str]], Any]  # its settings from the parsed flags
    run: Callable[[Any], int]


def _serve_flags(p: argparse.ArgumentParser) -> None:
    from epp.cmd.settings import add_serve_flags

    add_serve_flags(p)


def _serve_settings(ns: argparse.Namespace, argv: list[str]) -> ServeSettings:
    from epp.cmd.settings import ServeSettings

    return ServeSettings.from_args(ns)


def serve(settings: ServeSettings) -> int:
    import asyncio

    from epp.observe import configure

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


def _envoy_config_flags(p: argparse.ArgumentParser) -> None:
    from epp.cmd.envoy_config import add_flags

    add_flags(p)


def _envoy_config_settings(ns: argparse.Namespace, argv: list[str]) -> EnvoyConfigSettings:
    from epp.cmd.envoy_config import EnvoyConfigSettings

    return EnvoyConfigSettings.from_args(ns)


def _envoy_config(s: EnvoyConfigSettings) -> int:
    from epp.cmd.envoy_config import envoy_config_command

    return envoy_config_command(s)


def _explain_flags(p: argparse.ArgumentParser) -> None:
    from epp.api.settings import add_explain_flags

    add_explain_flags(p)


def _explain_settings(ns: argparse.Namespace, argv: list[str]) -> ExplainSettings:
    from epp.api.settings import ExplainSettings

    return ExplainSettings.from_args(ns)


def _explain(s: ExplainSettings) -> int:
    from epp.api import explain_command

    return explain_command(s)


def _stack_flags(p: argparse.ArgumentParser) -> None:
    from epp.stack.settings import add_flags

    add_flags(p)


def _stack_settings(ns: argparse.Namespace, argv: list[str]) -> StackSettings:
    from epp.stack.settings import StackSettings

    return StackSettings.from_args(ns)


def _stack(s: StackSettings) -> int:
    from epp.stack import stack_command

    return stack_command(s)


def _endpoints_flags(p: argparse.ArgumentParser) -> None:
    from epp.api.settings import add_endpoints_flags

    add_endpoints_flags(p)


def _endpoints_settings(ns: argparse.Namespace, argv: list[str]) -> EndpointsSettings:
    from epp.api.settings import EndpointsSettings

    return EndpointsSettings.from_args(ns)


def _endpoints(s: EndpointsSettings) -> int:
    from epp.api import endpoints_command

    return endpoints_command(s)


def _kv_relay_flags(p: argparse.ArgumentParser) -> None:
    from epp.fleet.kvevents.settings import add_relay_flags

    add_relay_flags(p)


def _kv_relay_settings(ns: argparse.Namespace, argv: list[str]) -> RelaySettings:
    from epp.fleet.kvevents.settings import RelaySettings

    return RelaySettings.from_args(ns)


def _kv_relay(s: RelaySettings) -> int:
    from epp.cmd.kvrelay import kv_relay_command

    return kv_relay_command(s)


COMMANDS: dict[str, Command] = {
    "serve": Command("run the endpoint picker (default)", _serve_flags, _serve_settings, serve),
    "envoy-config": Command("render an Envoy bootstrap that uses Pointsman", _envoy_config_flags,
                            _envoy_config_settings, _envoy_config),
    "explain": Command("ask a running Pointsman which endpoint a request would get, and why", _explain_flags,
                       _explain_settings, _explain),
    "stack": Command("run the local stack: modelsim fleet + Pointsman + Envoy, no Docker", _stack_flags,
                     _stack_settings, _stack),
    "endpoints": Command("list the endpoints a running Pointsman knows", _endpoints_flags, _endpoints_settings,
                         _endpoints),
    "kv-relay": Command("carry one engine's KV events into its pool's NATS JetStream stream", _kv_relay_flags,
                        _kv_relay_settings, _kv_relay),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `epp` parser with every command; with `only`, the flags of that command alone are built (the others
    keep their name and help, so `epp --help` reads the same)."""
    p = argparse.ArgumentParser(prog="epp", description="Pointsman: an Envoy ext_proc endpoint picker for LLMs")
    sub = p.add_subparsers(dest="command")
    for name, command in COMMANDS.items():
        parser = sub.add_parser(name, help=command.help)
        if only is None or name == only:
            command.add_flags(parser)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]  # `epp --pool-name x` works like GIE's binary
    if argv[0] == "serve":  # pflag syntax and other EPPs' flags (epp/cmd/foreign.py)
        from epp.cmd.settings import ServeSettings

        try:
            settings = ServeSettings.from_argv(argv[1:])
        except (ValueError, MissingExtra) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return serve(settings)
    parser = build_parser(only=argv[0] if argv[0] in COMMANDS else "")
    ns = parser.parse_args(argv)
    if ns.command not in COMMANDS:
        parser.print_help()
        return 2
    command = COMMANDS[ns.command]
    try:
        settings = command.settings(ns, argv)
    except (ValueError, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return command.run(settings)


if __name__ == "__main__":
    raise SystemExit(main())
