"""The `epp` command: serve, envoy-config, explain, endpoints.

Flags follow GIE's EPP where they overlap, so existing charts (and AI Runway) can start it unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from epp.argtypes import parse_bool as _bool
from epp.argtypes import parse_duration_arg as _duration
from epp.protocol import BodyMode

log = logging.getLogger("epp")


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ports")
    g.add_argument("--grpc-host", default="0.0.0.0", help="address the ext_proc gRPC server binds")
    g.add_argument("--grpc-port", type=int, default=9002, help="ext_proc + Pointsman API gRPC port (9002)")
    g.add_argument("--grpc-health-port", type=int, default=9003, help="grpc.health.v1 port (9003); 0 disables")
    g.add_argument("--metrics-port", type=int, default=9090, help="Prometheus port (9090); 0 disables")
    g.add_argument("--secure-serving", type=_bool, default=False, help="serve TLS on the gRPC port")
    g.add_argument("--cert-path", default=None, help="directory with tls.crt/tls.key (self-signed when absent)")
    g.add_argument("--grpc-transport", choices=("h2", "grpcio"), default="h2",
                   help="gRPC server for the --grpc-port: h2 (HTTP/2 on asyncio, the default: about a third of "
                        "grpc.aio's CPU per ext_proc request) or grpcio (grpc.aio); see docs/performance.md")
    g.add_argument("--eds", type=_bool, default=True,
                   help="serve the pools' endpoints to Envoy over EDS on the gRPC port (default true)")

    g = p.add_argument_group("pool and endpoints")
    g.add_argument("--pool-name", default=os.environ.get("POOL_NAME"), help="InferencePool to serve")
    g.add_argument("--pool-namespace", default=os.environ.get("NAMESPACE", "default"))
    g.add_argument("--pool-group", default="inference.networking.k8s.io", help="InferencePool API group")
    g.add_argument("--endpoints-file", default=None, help="standalone mode: a YAML file of pools and endpoints")
    g.add_argument("--endpoint-selector", default=None, help="standalone selector mode: k=v,... over pods")
    g.add_argument("--endpoint-target-ports", default=None, help="selector mode: comma list of ports")
    g.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: in-cluster, then ~/.kube)")
    g.add_argument("--epp-service-name", default=os.environ.get("EPP_SERVICE_NAME") or None,
                   help="serve every InferencePool of the namespace whose endpointPickerRef names this Service "
                        "(default: $EPP_SERVICE_NAME); --pool-name stays the default pool")

    g = p.add_argument_group("routes (Kthena ModelRoute, ModelServer, ExternalModelProvider)")
    g.add_argument("--routes-file", action="append", default=[],
                   help="route documents, multi-document YAML, hot-reloaded (repeatable)")
    g.add_argument("--watch-routes", action="store_true",
                   default=os.environ.get("POINTSMAN_WATCH_ROUTES", "").lower() in ("1", "true", "yes"),
                   help="watch route documents in --pool-namespace (Kubernetes; default: $POINTSMAN_WATCH_ROUTES)")
    g.add_argument("--provider-secrets-dir", default=None,
                   help="standalone provider credentials: <dir>/<secret name>/<key> (the layout of a Secret volume)")
    g.add_argument("--provider-header", default="x-pointsman-provider",
                   help="the request header Envoy's provider routes match (Pointsman always sets or removes it)")

    g = p.add_argument_group("scheduling")
    g.add_argument("--config-file", default=None, help="scheduling config (EndpointPickerConfig / SchedulingProfile)")
    g.add_argument("--config-text", default=None, help="scheduling config as inline YAML")
    g.add_argument("--refresh-metrics-interval", type=_duration, default=0.05, help="scrape interval (50ms)")
    g.add_argument("--metrics-staleness-threshold", type=_duration, default=2.0, help="stale after (2s)")
    g.add_argument("--seed", type=int, default=None, help="seed the scheduler's random source")

    from epp.ratelimit.wiring import add_flags as add_ratelimit_flags

    add_ratelimit_flags(p, _duration)
    from epp.fleet.scrape.scraper import add_flags as add_scrape_flags

    add_scrape_flags(p, _duration)

    g = p.add_argument_group("health (scraping and passive)")
    g.add_argument("--scrape-timeout", type=_duration, default=None,
                   help="timeout of one metrics scrape (default: 3 hung scrapes in a row fit in the staleness "
                        "threshold: 0.45s with 2s)")
    g.add_argument("--passive-health", type=_bool, default=True,
                   help="count failed responses (5xx, resets, silent streams) against endpoints (default true)")
    g.add_argument("--passive-failure-threshold", type=int, default=5,
                   help="failed responses in a row that take an endpoint out (5)")
    g.add_argument("--passive-cooldown", type=_duration, default=10.0,
                   help="how long an endpoint stays out before one probe request is let through (10s)")
    g.add_argument("--passive-max-cooldown", type=_duration, default=300.0,
                   help="each failed probe doubles the cool-down, up to this (5m)")
    g.add_argument("--passive-silence-timeout", type=_duration, default=60.0,
                   help="a streaming response silent this long counts as failed (60s)")

    g = p.add_argument_group("protocol")
    g.add_argument("--request-body-mode", type=BodyMode.parse, default=BodyMode.FULL_DUPLEX_STREAMED)
    g.add_argument("--response-body-mode", type=BodyMode.parse, default=BodyMode.FULL_DUPLEX_STREAMED)
    g.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024, help="413 above this (64 MiB)")
    g.add_argument("--fallbacks", type=int, default=0, help="extra endpoints in envoy.lb metadata (override_host)")
    g.add_argument("--enable-conformance-header", action="store_true",
                   help="honour test-epp-endpoint-selection (conformance tests only)")
    g.add_argument("--log-decisions", action="store_true", help="log one line per routing decision")
    g.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="asyncio (default) or uvloop (pip install uvloop; see docs/performance.md)")

    from epp.request.outputs import add_flags as add_output_flags

    add_output_flags(p.add_argument_group("routing outputs (docs/performance.md)"), _bool)

    g = p.add_argument_group("dashboard (a live page on the metrics port; see docs/dashboard.md)")
    g.add_argument("--dashboard", type=_bool, default=True,
                   help="serve the dashboard and record decisions for it (true); false turns both off")
    g.add_argument("--dashboard-path-prefix", default="/", help="URL path of the page on the metrics port (/)")
    g.add_argument("--dashboard-token", default=os.environ.get("POINTSMAN_DASHBOARD_TOKEN") or None,
                   help="require this bearer token for the page and its APIs (/metrics stays open); "
                        "prefer the POINTSMAN_DASHBOARD_TOKEN environment variable, flags show in ps")
    g.add_argument("--dashboard-decisions", type=int, default=500,
                   help="recent decisions kept for the page, with their per-plugin scores (500)")
    g.add_argument("-v", "--v", type=int, default=int(os.environ.get("EPP_VERBOSITY", "1")), help="log verbosity")

    # Precise prefix routing (docs/kv-events.md): the engines' KV events and request tokenization.
    from epp.fleet.kvevents.sources import add_kv_events_flags
    from epp.tokenize.shell import add_tokenize_flags

    add_kv_events_flags(p)
    add_tokenize_flags(p)

    from epp.bus.flags import add_bus_flags  # HOOK (replicas): --workers, --bus-*

    add_bus_flags(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp", description="Pointsman: an Envoy ext_proc endpoint picker for LLMs")
    sub = p.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the endpoint picker (default)")
    _add_serve_flags(serve)

    ec = sub.add_parser("envoy-config", help="render an Envoy bootstrap that uses Pointsman")
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
    ec.add_argument("--epp-tls", action="store_true", help="talk TLS to Pointsman")
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
    ec.add_argument("--message-timeout", type=_duration, default=0.0,
                    help="ext_proc message timeout (300s closed, 30s open; Envoy does not apply it in "
                         "FULL_DUPLEX_STREAMED): keep it above the flow-control request TTL")
    ec.add_argument("-o", "--output", default="-")

    ex = sub.add_parser("explain", help="ask a running Pointsman which endpoint a request would get, and why")
    ex.add_argument("--addr", default="127.0.0.1:9002")
    ex.add_argument("--path", default="/v1/chat/completions")
    ex.add_argument("-H", "--header", action="append", default=[], help="name: value")
    ex.add_argument("--body", default=None, help="request body (JSON); '@file' reads a file; default: stdin")
    ex.add_argument("--pool", default="")
    ex.add_argument("--json", action="store_true", help="print JSON instead of a table")

    st = sub.add_parser("stack", help="run the local stack: modelsim fleet + Pointsman + Envoy, no Docker")
    from epp.stack.localstack import add_flags

    add_flags(st)

    ep = sub.add_parser("endpoints", help="list the endpoints a running Pointsman knows")
    ep.add_argument("--addr", default="127.0.0.1:9002")
    ep.add_argument("--pool", default="")
    ep.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]  # `epp --pool-name x` works like GIE's binary
    args = build_parser().parse_args(argv)
    if args.command == "serve" and args.workers != 1 and args.worker_index is None:  # HOOK (replicas)
        from epp.workers import supervise

        return supervise(args, argv)
    if args.command == "serve":
        from epp.cmd.app import run

        level = logging.DEBUG if args.v >= 3 else logging.INFO if args.v >= 1 else logging.WARNING
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            if args.event_loop == "uvloop":
                try:
                    import uvloop
                except ImportError:
                    print("error: --event-loop uvloop needs the uvloop package (pip install uvloop)", file=sys.stderr)
                    return 2
                return uvloop.run(run(args))
            return asyncio.run(run(args))
        except KeyboardInterrupt:
            return 0
    if args.command == "envoy-config":
        return _envoy_config(args)
    if args.command == "explain":
        from epp.api.client import explain_command

        return explain_command(args)
    if args.command == "stack":
        from epp.stack.localstack import stack_command

        return stack_command(args)
    if args.command == "endpoints":
        from epp.api.client import endpoints_command

        return endpoints_command(args)
    build_parser().print_help()
    return 2


def _envoy_config(args: argparse.Namespace) -> int:
    from epp.envoy_config import EnvoyConfigSpec, render_yaml

    endpoints: list[tuple[str, int]] = []
    for e in args.endpoint:
        host, _, port = e.rpartition(":")
        endpoints.append((host.strip("[]"), int(port)))
    pool_name = args.pool_name
    if args.endpoints_file:
        import yaml

        from epp.fleet.static_source import parse_static_config

        with open(args.endpoints_file) as f:
            pools, _ = parse_static_config(yaml.safe_load(f), args.endpoints_file)
        chosen = [p for p in pools if args.pool_name in (None, p[0].name)]
        if not chosen:
            print(f"error: no pool {args.pool_name!r} in {args.endpoints_file}", file=sys.stderr)
            return 2
        pool_name = chosen[0][0].name
        # Route documents name several pools (a ModelRouter's InferenceServices): with no --pool-name, the pool
        # cluster holds them all, since Pointsman picks the pod.
        listed = chosen if args.routes_file and args.pool_name is None else chosen[:1]
        if not args.eds:  # with --eds Envoy gets the endpoints from Pointsman, not from the file
            endpoints += [(e.address, e.port) for _, eps in listed for e in eps]
    fragments = None
    if args.routes_file:  # HOOK (routing layer): epp/envoy_config/providers.py
        from epp.envoy_config.providers import fragments_from_files

        fragments, route_eps, errors = fragments_from_files(args.routes_file, header=args.provider_header,
                                                            ca_file=args.provider_ca_file)
        if errors:
            for e in errors:
                print(f"error: {e}", file=sys.stderr)
            return 2
        if not args.eds:  # with --eds the ModelServers' static endpoints come from Pointsman too
            endpoints += [e for e in route_eps if e not in endpoints]
    epps = []
    for e in args.epp or ["127.0.0.1:9002"]:
        host, _, port = e.rpartition(":")
        if not port.isdigit():
            print(f"error: --epp {e!r}: expected host:port", file=sys.stderr)
            return 2
        epps.append((host.strip("[]") or "127.0.0.1", int(port)))
    (epp_host, epp_port), *replicas = epps
    open_mode = args.failure_mode == "open"
    spec = EnvoyConfigSpec(
        variant=args.variant or ("override-host" if args.eds or open_mode else "original-dst"),
        listen_port=args.listen_port,
        listen_address=args.listen_address,
        admin_port=args.admin_port,
        epp_host=epp_host,
        epp_port=epp_port,
        epp_replicas=replicas,  # HOOK (replicas): several Pointsman replicas, workers per replica
        epp_workers=args.epp_workers,
        epp_max_streams_per_connection=args.epp_max_streams_per_connection,
        epp_max_requests_per_connection=args.epp_max_requests_per_connection,
        endpoints=endpoints,
        eds=args.eds,
        pool_name=pool_name or "default",
        request_body_mode=args.request_body_mode,
        response_body_mode=args.response_body_mode,
        response_phases=args.response_phases,
        epp_tls=args.epp_tls,
        route_fragments=fragments,
        failure_mode=args.failure_mode,
        message_timeout_s=args.message_timeout,
    )
    if spec.failure_mode == "open" and "FULL_DUPLEX_STREAMED" in spec.body_modes():
        print("warning: with a FULL_DUPLEX_STREAMED body Envoy answers 500 to requests whose ext_proc stream breaks "
              "(the body chunks it sent are lost), until health checks take Pointsman out (about 2 s); the "
              "fail-open defaults are BUFFERED requests and STREAMED responses", file=sys.stderr)
    try:
        text = render_yaml(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
