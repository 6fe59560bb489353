"""`epp envoy-config`: render an Envoy bootstrap that uses Pointsman (epp/envoy_config; the 'envoy-config' extra).

The flags are parsed once into `EnvoyConfigSettings` (bad values fail there, exit 2); the command reads the
endpoints file and the route documents it names, builds the `EnvoyConfigSpec` and writes the YAML.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from epp.argtypes import parse_bool, parse_duration_arg
from epp.extras import check

Address = tuple[str, int]


def add_flags(ec: argparse.ArgumentParser) -> None:
    ec.add_argument("--variant", choices=("original-dst", "override-host"), default=None,
                    help="original-dst (default), or override-host (the default with --eds)")
    ec.add_argument("--listen-port", type=int, default=8081)
    ec.add_argument("--listen-address", default="127.0.0.1")
    ec.add_argument("--admin-port", type=int, default=9901)
    ec.add_argument("--epp", action="append", default=None,
                    help="host:port of Pointsman's gRPC server (127.0.0.1:9002); repeat it for several replicas")
    ec.add_argument("--epp-workers", type=int, default=1,
                    help="workers per Pointsman (`epp serve --workers N`): opens enough connections to spread over "
                         "them (docs/replicas.md)")
    ec.add_argument("--epp-max-streams-per-connection", type=int, default=0,
                    help="HTTP/2 streams per connection to Pointsman (8 with --epp-workers > 1; 0: Envoy's default)")
    ec.add_argument("--epp-max-requests-per-connection", type=int, default=0,
                    help="replace a connection to Pointsman after this many streams (1000 with --epp-workers > 1)")
    ec.add_argument("--endpoint", action="append", default=[], help="override-host: a pool endpoint ip:port")
    ec.add_argument("--endpoints-file", default=None, help="override-host: take the endpoints from this file")
    ec.add_argument("--pool-name", default=None,
                    help="which pool: with --endpoints-file (default: the first), the EDS resource with --eds")
    ec.add_argument("--eds", action="store_true",
                    help="override-host pool cluster fed live by Pointsman's EDS server (on the --epp port)")
    ec.add_argument("--request-body-mode", default="",
                    help="ext_proc request body mode (default FULL_DUPLEX_STREAMED; BUFFERED with --failure-mode open)")
    ec.add_argument("--response-body-mode", default="",
                    help="ext_proc response body mode (default FULL_DUPLEX_STREAMED; STREAMED with --failure-mode open)")
    ec.add_argument("--response-phases", choices=("full", "headers", "lean"), default="full",
                    help="full: every response phase; headers: response headers, no body (status for passive "
                         "health, no usage); lean: request phases only (half the messages; no usage, no "
                         "served-endpoint reading, passive health blind)")
    ec.add_argument("--epp-tls", type=parse_bool, nargs="?", const=True, default=True,
                    help="talk TLS to Pointsman, without verifying its certificate (default true, as `epp serve` "
                         "serves TLS by default); --epp-tls=false for a Pointsman run with --secure-serving=false")
    ec.add_argument("--routes-file", action="append", default=[],
                    help="route documents: a cluster and route per ExternalModelProvider, retries for ModelServers, "
                         "and (override-host) the ModelServers' static endpoints (repeatable)")
    ec.add_argument("--provider-ca-file", default="/etc/ssl/certs/ca-certificates.crt",
                    help="CA bundle that verifies external providers' certificates (the system bundle)")
    ec.add_argument("--provider-header", default="x-pointsman-provider",
                    help="the request header Pointsman sets to send a request to a provider's cluster")
    ec.add_argument("--failure-mode", choices=("closed", "open"), default="closed",
                    help="closed (default): requests fail while Pointsman is down; open: they go on to the "
                         "fallback policy over the pool's endpoints (needs --eds or an endpoint list; the "
                         "InferencePool's failureMode FailOpen)")
    ec.add_argument("--message-timeout", type=parse_duration_arg, default=0.0,
                    help="ext_proc message timeout (300s closed, 30s open; Envoy does not apply it in "
                         "FULL_DUPLEX_STREAMED): keep it above the flow-control request TTL")
    ec.add_argument("-o", "--output", default="-")
    from epp.envoy_config import add_observe_flags

    add_observe_flags(ec)  # --tracing-collector, --access-log (docs/observability.md)


def _address(text: str, flag: str) -> Address:
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"{flag} {text!r}: expected host:port")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class EnvoyConfigSettings:
    """The `EnvoyConfigSpec` fields the flags set directly, and where the endpoints and routes come from."""

    spec: dict[str, Any] = field(default_factory=dict)  # EnvoyConfigSpec keyword arguments
    endpoints: tuple[Address, ...] = ()  # --endpoint
    endpoints_file: str | None = None
    pool_name: str | None = None
    routes_files: tuple[str, ...] = ()
    provider_header: str = "x-pointsman-provider"
    provider_ca_file: str = "/etc/ssl/certs/ca-certificates.crt"
    output: str = "-"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> EnvoyConfigSettings:
        check("envoy-config", "epp envoy-config")
        epps = [_address(e, "--epp") for e in ns.epp or ["127.0.0.1:9002"]]
        (epp_host, epp_port), *replicas = [(host or "127.0.0.1", port) for host, port in epps]
        spec = {
            "variant": ns.variant or ("override-host" if ns.eds or ns.failure_mode == "open" else "original-dst"),
            "listen_port": ns.listen_port, "listen_address": ns.listen_address, "admin_port": ns.admin_port,
            "epp_host": epp_host, "epp_port": epp_port,
            "epp_replicas": replicas,  # HOOK (replicas): several Pointsman replicas, workers per replica
            "epp_workers": ns.epp_workers, "epp_max_streams_per_connection": ns.epp_max_streams_per_connection,
            "epp_max_requests_per_connection": ns.epp_max_requests_per_connection, "eds": ns.eds,
            "request_body_mode": ns.request_body_mode, "response_body_mode": ns.response_body_mode,
            "response_phases": ns.response_phases, "epp_tls": ns.epp_tls, "failure_mode": ns.failure_mode,
            "message_timeout_s": ns.message_timeout,
            **_observe_fields(ns),
        }
        return cls(spec=spec, endpoints=tuple(_address(e, "--endpoint") for e in ns.endpoint),
                   endpoints_file=ns.endpoints_file, pool_name=ns.pool_name, routes_files=tuple(ns.routes_file),
                   provider_header=ns.provider_header, provider_ca_file=ns.provider_ca_file, output=ns.output)


def _observe_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """Envoy's own tracing to an OpenTelemetry collector, and an access log with the decision id."""
    from epp.envoy_config import parse_collector

    return {"tracing_collector": parse_collector(ns.tracing_collector) if ns.tracing_collector else None,
            "tracing_service_name": ns.tracing_service_name, "tracing_sampling": ns.tracing_sampling,
            "access_log": ns.access_log}


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _file_pools(s: EnvoyConfigSettings) -> tuple[str | None, list[Address]]:
    """The pool named (or the first) in the endpoints file, and its endpoints; ValueError for a missing pool."""
    from epp.fleet import read_static_file

    assert s.endpoints_file is not None
    pools = read_static_file(s.endpoints_file).pools
    chosen = [p for p in pools if s.pool_name in (None, p[0].name)]
    if not chosen:
        raise ValueError(f"no pool {s.pool_name!r} in {s.endpoints_file}")
    # Route documents name several pools (a ModelRouter's InferenceServices): with no --pool-name, the pool
    # cluster holds them all, since Pointsman picks the pod.
    listed = chosen if s.routes_files and s.pool_name is None else chosen[:1]
    return chosen[0][0].name, [(e.address, e.port) for _, eps in listed for e in eps]


def envoy_config_command(s: EnvoyConfigSettings) -> int:
    from epp.envoy_config import EnvoyConfigSpec, render_yaml

    eds = bool(s.spec["eds"])
    endpoints, pool_name = list(s.endpoints), s.pool_name
    if s.endpoints_file:
        try:
            pool_name, listed = _file_pools(s)
        except ValueError as e:
            return _error(str(e))
        if not eds:  # with --eds Envoy gets the endpoints from Pointsman, not from the file
            endpoints += listed
    fragments = None
    if s.routes_files:  # HOOK (routing layer): epp/envoy_config/providers.py
        from epp.envoy_config import fragments_from_files

        fragments, route_eps, errors = fragments_from_files(list(s.routes_files), header=s.provider_header,
                                                            ca_file=s.provider_ca_file)
        if errors:
            for error in errors:
                print(f"error: {error}", file=sys.stderr)
            return 2
        if not eds:  # with --eds the ModelServers' static endpoints come from Pointsman too
            endpoints += [e for e in route_eps if e not in endpoints]
    spec = EnvoyConfigSpec(**s.spec, endpoints=endpoints, pool_name=pool_name or "default", route_fragments=fragments)
    if spec.failure_mode == "open" and "FULL_DUPLEX_STREAMED" in spec.body_modes():
        print("warning: with a FULL_DUPLEX_STREAMED body Envoy answers 500 to requests whose ext_proc stream breaks "
              "(the body chunks it sent are lost), until health checks take Pointsman out (about 2 s); the "
              "fail-open defaults are BUFFERED requests and STREAMED responses", file=sys.stderr)
    try:
        text = render_yaml(spec)
    except ValueError as e:
        return _error(str(e))
    if s.output == "-":
        sys.stdout.write(text)
    else:
        with open(s.output, "w") as f:
            f.write(text)
    return 0


__all__ = ["EnvoyConfigSettings", "add_flags", "envoy_config_command"]
