"""Flags of the other EPPs (GIE v1.0-v1.5, GIE v1.6's lwepp, llm-d-router v0.9-main, KServe, llm-d-deployer), and
what `epp serve` does with each, so a Deployment written for one of them starts Pointsman unchanged.

Three kinds of entry, all in FOREIGN_FLAGS (docs/deploy.md "Foreign flags" is this table in prose):
- native: `epp serve` defines the flag itself with the same meaning (`--pool-name`, `--grpc-port`, ...);
- mapped: the flag becomes a Pointsman flag (`--zap-encoder json` -> `--log-format json`, a legacy metric name
  -> the engine whose metrics are read);
- accepted: the flag means nothing here (leader election: Pointsman is active-active; pprof); it is accepted and
  logged once at start with what Pointsman does instead.
ALIASES are the camelCase spellings of old GIE releases that KServe and llm-d-deployer still pass. A flag in none of
these is unknown: `epp serve` exits 2 naming it, as the Go binaries do.

`adopt` reads a command line with pflag's rules (epp/cmd/pflag.py) and returns the one argparse parses, plus the
notices to log. Standard library only: the CLI imports this before anything else.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from epp.cmd.pflag import BOOL, REPEAT, SLICE, SWITCH, VALUE, FlagError, Occurrence, Parsed, parse

if TYPE_CHECKING:
    from scheduling.api import Scrape

NATIVE, MAPPED, ACCEPTED = "native", "mapped", "accepted"

GIE = "GIE v1.x"
LWEPP = "GIE v1.6 lwepp"
LLMD = "llm-d-router v0.9+"
Translate = Callable[[str], list[Occurrence]]


@dataclass(frozen=True)
class Foreign:
    name: str  # without dashes
    kind: str  # pflag kind (epp/cmd/pflag.py)
    how: str  # NATIVE, MAPPED or ACCEPTED
    does: str  # what Pointsman does with it (docs and the start-up notice)
    who: tuple[str, ...] = (GIE, LLMD)
    translate: Translate | None = None  # MAPPED: value -> Pointsman flags


def _to(name: str) -> Translate:
    return lambda v: [Occurrence(name, v)]


def _zap_encoder(v: str) -> list[Occurrence]:
    formats = {"json": "json", "console": "text"}
    if v not in formats:
        raise FlagError(f'invalid argument "{v}" for "--zap-encoder" flag: expected json or console')
    return [Occurrence("log-format", formats[v])]


def _zap_log_level(v: str) -> list[Occurrence]:
    names = {"debug": 3, "info": 1, "error": 0, "panic": 0}
    if v in names:
        return [Occurrence("v", str(names[v]))]
    try:
        level = int(v)  # zap's numeric level is -v: -4 is GIE's debug
    except ValueError:
        raise FlagError(f'invalid argument "{v}" for "--zap-log-level" flag: expected debug, info, error, panic '
                        "or an integer") from None
    return [Occurrence("v", str(max(0, -level)))]


QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
UNITS = {None: 1, "k": 1000, "K": 1000, "M": 10**6, "G": 10**9, "T": 10**12,
         "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity_bytes(flag: str, v: str) -> int:
    """llm-d's message-size quantity: `10MiB`, `25MB`, `4Mi`, `1048576` (a trailing B is dropped)."""
    text = v[:-1] if v.endswith("B") else v
    m = QUANTITY.match(text)
    if not m:
        raise FlagError(f'invalid argument "{v}" for "--{flag}" flag: expected a size like 10MiB or 4194304')
    return int(float(m.group(1)) * UNITS[m.group(2)])


def _max_recv(v: str) -> list[Occurrence]:
    return [] if v == "" else [Occurrence("grpc-max-message-bytes", str(quantity_bytes("grpc-max-recv-msg-size", v)))]


# The engines whose metric names a legacy metric flag may name (prefix -> Pointsman's engine).
ENGINE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"), ("sglang:", "sglang"), ("trtllm_", "trtllm-serve"), ("nv_trt_llm_", "triton"),
)


def engine_of_metric(flag: str, v: str) -> str | None:
    """The engine whose metrics a legacy metric flag names (None for "": that metric is not read)."""
    if v == "":
        return None
    for prefix, engine in ENGINE_PREFIXES:
        if v.startswith(prefix):
            return engine
    raise FlagError(f"--{flag} {v!r}: Pointsman reads each engine's own metrics and knows no engine exporting "
                    f"this name (it knows names beginning with {', '.join(p for p, _ in ENGINE_PREFIXES)}); "
                    "set the engine with the llm-d.ai/engine-type pod label or core-metrics-extractor instead")


def _legacy_metric(flag: str) -> Translate:
    def translate(v: str) -> list[Occurrence]:
        engine = engine_of_metric(flag, v)
        return [] if engine is None else [Occurrence("model-server-engine", engine)]
    return translate


LEGACY_METRICS = ("total-queued-requests-metric", "total-running-requests-metric", "kv-cache-usage-percentage-metric",
                  "lora-info-metric", "cache-info-metric")
_METRICS_DOES = ("mapped: the metric's name selects the engine whose metrics Pointsman reads for pods without an "
                 "engine label (vllm:, sglang:, trtllm_, nv_trt_llm_ names); an empty value turns nothing off; "
                 "another name is an error")


def _ignored(name: str, kind: str, does: str, who: tuple[str, ...] = (GIE, LLMD)) -> Foreign:
    return Foreign(name, kind, ACCEPTED, does, who)


def _native(name: str, kind: str, does: str, who: tuple[str, ...] = (GIE, LLMD)) -> Foreign:
    return Foreign(name, kind, NATIVE, does, who)


ALL = (GIE, LWEPP, LLMD)
FOREIGN_FLAGS: tuple[Foreign, ...] = (
    # the pool and its endpoints
    _native("pool-name", VALUE, "the InferencePool to serve", ALL),
    _native("pool-namespace", VALUE, "its namespace (default $NAMESPACE, then default)", ALL),
    _native("pool-group", VALUE, "inference.networking.k8s.io (v1) or inference.networking.x-k8s.io (v1alpha2)", ALL),
    _native("endpoint-selector", VALUE, "pods by label without an InferencePool (k=v,...)"),
    _native("endpoint-target-ports", SLICE, "their ports (comma list; repeats append)", ALL),
    _native("kubeconfig", VALUE, "kubeconfig path (default in-cluster, then ~/.kube/config)", (GIE,)),
    # ports, TLS, health
    _native("grpc-port", VALUE, "ext_proc port (9002); also serves gRPC health", ALL),
    _native("grpc-health-port", VALUE, "plaintext gRPC health port (9003)", ALL),
    _native("metrics-port", VALUE, "Prometheus /metrics port (9090)", ALL),
    _native("secure-serving", BOOL, "TLS on the ext_proc port, default true as in GIE", ALL),
    _native("cert-path", VALUE, "directory with tls.crt/tls.key; self-signed without it"),
    _native("enable-cert-reload", BOOL, "reload tls.crt/tls.key from --cert-path when the files change"),
    _native("metrics-endpoint-auth", BOOL, "/metrics needs a bearer token Kubernetes allows to get /metrics "
            "(TokenReview + SubjectAccessReview); default true in Kubernetes, false standalone"),
    Foreign("ha-enable-leader-election", BOOL, MAPPED,
            "accepted: Pointsman is active-active, every replica serves and counts as the leader; the health port "
            "answers liveness and readiness as GIE's leader does (and SERVICE_UNKNOWN for other names)",
            translate=_to("health-leader-election")),
    _ignored("health-checking", BOOL, "accepted: the ext_proc port always answers gRPC health, this flag or not",
             ALL),
    _ignored("tls-min-version", VALUE, "accepted: the TLS port negotiates TLS 1.2 or 1.3 (Python's ssl defaults)",
             (LLMD,)),
    _ignored("tls-cipher-suites", SLICE, "accepted: ciphers are Python's ssl defaults (TLS 1.2+)", (LLMD,)),
    _ignored("metrics-cert-dir", VALUE, "accepted: the metrics port serves plain HTTP (use --metrics-endpoint-auth "
             "for access control)", (LLMD,)),
    _ignored("metrics-client-ca-file", VALUE, "accepted: the metrics port serves plain HTTP, no client "
             "certificates", (LLMD,)),
    # configuration
    _native("config-file", VALUE, "the EndpointPickerConfig (hot-reloaded)"),
    _native("config-text", VALUE, "the EndpointPickerConfig inline"),
    _ignored("allow-experimental-plugins", BOOL, "accepted: every plugin Pointsman implements may be configured",
             (LLMD,)),
    # logs and traces
    _native("v", VALUE, "verbosity: 0 warnings, 1-2 info, 3 and above debug (GIE: 4 debug)"),
    Foreign("zap-encoder", VALUE, MAPPED, "mapped: json -> --log-format json, console -> --log-format text",
            ALL, _zap_encoder),
    Foreign("zap-log-level", VALUE, MAPPED, "mapped to --v: debug 3, info 1, error/panic 0, an integer -n: n",
            ALL, _zap_log_level),
    _ignored("zap-devel", BOOL, "accepted: no development mode; --log-format and --v set format and level", ALL),
    _ignored("zap-stacktrace-level", VALUE, "accepted: a logged exception always carries its traceback", ALL),
    _ignored("zap-time-encoding", VALUE, "accepted: log lines carry ISO 8601 times", ALL),
    _native("tracing", BOOL, "OpenTelemetry traces (Pointsman's default is off; GIE's is on)"),
    # scraping the model servers
    _native("refresh-metrics-interval", VALUE, "scrape interval (50ms)"),
    _native("metrics-staleness-threshold", VALUE, "metrics older than this are stale (2s)"),
    _ignored("refresh-prometheus-metrics-interval", VALUE,
             "accepted: pool gauges are computed when /metrics is scraped"),
    Foreign("model-server-metrics-scheme", VALUE, NATIVE, "http or https for scraping (over a config's "
            "metrics-data-source)", (GIE,)),
    Foreign("model-server-metrics-path", VALUE, NATIVE, "scrape path (over a config's metrics-data-source)", (GIE,)),
    Foreign("model-server-metrics-port", VALUE, NATIVE, "scrape this port instead of the endpoint's (0: the "
            "endpoint's)", (GIE,)),
    Foreign("model-server-metrics-https-insecure-skip-verify", BOOL, NATIVE, "do not verify https scrape "
            "certificates (default true)", (GIE,)),
    *(Foreign(n, VALUE, MAPPED, _METRICS_DOES, translate=_legacy_metric(n)) for n in LEGACY_METRICS),
    # request handling
    _ignored("disable-endpoint-subset-filter", BOOL,
             "accepted: Pointsman always honours the gateway's endpoint subset hint"),
    _ignored("emit-endpoint-scores", BOOL, "accepted: scores are not emitted in metadata; ask `epp explain` or "
             "decision receipts", (LLMD,)),
    _ignored("drain-timeout", VALUE, "accepted: on SIGTERM readiness goes NOT_SERVING first and open streams "
             "finish within the pod's grace period", (LLMD,)),
    Foreign("grpc-max-recv-msg-size", VALUE, MAPPED, "mapped: --grpc-max-message-bytes", (LLMD,), _max_recv),
    _ignored("grpc-max-send-msg-size", VALUE, "accepted: Pointsman's replies are small, no limit applies", (LLMD,)),
    _ignored("enable-grpc-stream-metrics", BOOL, "accepted: ext_proc stream metrics are always exported", (LLMD,)),
    # the process
    _ignored("enable-pprof", BOOL, "accepted: no Go pprof; profile with py-spy (docs/performance.md)"),
    _ignored("kube-api-qps", VALUE, "accepted: watches, not polling; no client-side rate limit", (LLMD,)),
    _ignored("kube-api-burst", VALUE, "accepted: watches, not polling; no client-side rate limit", (LLMD,)),
)
BY_NAME: dict[str, Foreign] = {f.name: f for f in FOREIGN_FLAGS}
SILENT = ("zap-encoder", "zap-log-level", "grpc-max-recv-msg-size")  # mapped with the same meaning: no notice

# camelCase names of GIE before v1.0, still passed by KServe's LLMInferenceService config and llm-d-deployer.
ALIASES: dict[str, str] = {
    "poolName": "pool-name", "poolNamespace": "pool-namespace", "grpcPort": "grpc-port",
    "grpcHealthPort": "grpc-health-port", "secureServing": "secure-serving", "certPath": "cert-path",
    "modelServerMetricsScheme": "model-server-metrics-scheme",
    "modelServerMetricsHttpsInsecureSkipVerify": "model-server-metrics-https-insecure-skip-verify",
    "modelServerMetricsPath": "model-server-metrics-path", "modelServerMetricsPort": "model-server-metrics-port",
    "configPath": "config-file", "extProcPort": "grpc-port", "metricsPort": "metrics-port",
    "refreshMetricsInterval": "refresh-metrics-interval",
}


def add_flags(g: argparse._ActionsContainer, parse_bool: Callable[[str], bool]) -> None:
    """The Pointsman flags foreign flags map onto, that no subsystem defines (the "compatibility" group)."""
    g.add_argument("--model-server-metrics-scheme", choices=("http", "https"), default=None,
                   help="scrape model servers over http or https (default: the config's, else http)")
    g.add_argument("--model-server-metrics-path", default=None, help="scrape path (default: the config's, else "
                   "/metrics)")
    g.add_argument("--model-server-metrics-port", type=int, default=0,
                   help="scrape this port of every endpoint instead of its serving port (0: the serving port)")
    g.add_argument("--model-server-metrics-https-insecure-skip-verify", type=parse_bool, default=None,
                   help="with https: do not verify the model servers' certificates (default true)")
    g.add_argument("--model-server-engine", default=None,
                   help="the engine of endpoints without an engine label (vllm, sglang, trtllm-serve, triton; "
                        "default: the config's, else vllm)")
    g.add_argument("--health-leader-election", type=parse_bool, default=False,
                   help="answer gRPC health as GIE's elected leader does (set by --ha-enable-leader-election)")


@dataclass(frozen=True)
class CompatSettings:
    """What the foreign flags changed: scraping overrides (on top of the config's metrics-data-source) and the
    health answers; `notices` are logged once at start."""

    scrape_scheme: str | None = None
    scrape_path: str | None = None
    scrape_port: int = 0
    scrape_insecure_skip_verify: bool | None = None
    default_engine: str | None = None
    leader_election: bool = False
    notices: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, ns: argparse.Namespace, notices: Iterable[str] = ()) -> CompatSettings:
        port = ns.model_server_metrics_port
        if not 0 <= port <= 65535:
            raise ValueError(f"--model-server-metrics-port: expected a port 0-65535, got {port}")
        return cls(ns.model_server_metrics_scheme, ns.model_server_metrics_path, port,
                   ns.model_server_metrics_https_insecure_skip_verify, ns.model_server_engine,
                   ns.health_leader_election, tuple(notices))

    def scrape(self, base: Scrape) -> Scrape:
        """A config's scraping (metrics-data-source, core-metrics-extractor) with what the flags set on top."""
        skip = base.insecure_skip_verify if self.scrape_insecure_skip_verify is None else \
            self.scrape_insecure_skip_verify
        return replace(base, scheme=self.scrape_scheme or base.scheme, path=self.scrape_path or base.path,
                       insecure_skip_verify=skip, default_engine=self.default_engine or base.default_engine)


@dataclass(frozen=True)
class Adopted:
    argv: list[str]  # for argparse
    notices: tuple[str, ...] = ()  # to log once at start
    stray: tuple[str, ...] = field(default_factory=tuple)


def kinds_of(parser: argparse.ArgumentParser, parse_bool: Callable[[str], bool]) -> tuple[dict[str, str],
                                                                                           dict[str, str]]:
    """(long name -> pflag kind, shorthand letter -> long name) of an argparse parser's options."""
    kinds: dict[str, str] = {}
    short: dict[str, str] = {}
    for action in parser._actions:
        longs = [o[2:] for o in action.option_strings if o.startswith("--")]
        if not longs or "help" in longs:
            continue
        if action.nargs == 0:
            kind = SWITCH
        elif action.type is parse_bool:
            kind = BOOL
        elif isinstance(action, argparse._AppendAction):
            kind = REPEAT
        else:
            kind = VALUE
        for name in longs:
            kinds[name] = kind
        for o in action.option_strings:
            if len(o) == 2 and o[0] == "-" and o[1] != "-":
                short[o[1]] = longs[0]
    return kinds, short


def adopt(argv: Iterable[str], kinds: Mapping[str, str], shorthands: Mapping[str, str]) -> Adopted:
    """`argv` (pflag syntax, foreign flags and all) as the command line argparse parses for `epp serve`."""
    every = {**{f.name: f.kind for f in FOREIGN_FLAGS if f.how != NATIVE}, **kinds}
    parsed = parse(argv, every, shorthands, ALIASES)
    out: list[Occurrence] = []
    noticed: dict[str, dict[str, str]] = {}  # what Pointsman does -> {flag: its last value}
    engines: dict[str, str] = {}
    for o in parsed.occurrences:
        f = BY_NAME.get(o.name)
        if f is None or f.how == NATIVE or o.name in kinds:
            out.append(o)
            continue
        mapped = [] if f.translate is None else f.translate(o.value)
        for m in mapped:
            if m.name == "model-server-engine":
                engines[o.name] = m.value
        if f.name not in SILENT:
            noticed.setdefault(f.does, {})[o.name] = o.value
        out += mapped
    if len(set(engines.values())) > 1:
        named = ", ".join(f"--{k} names {v}" for k, v in engines.items())
        raise FlagError(f"the legacy metric flags name different engines ({named}); give one engine's names")
    notices = [", ".join(f"--{k}={v}" for k, v in flags.items()) + f": {does}" for does, flags in noticed.items()]
    if parsed.positionals:
        notices.append(f"ignored stray arguments {list(parsed.positionals)} (pflag reads `--flag false` as --flag "
                       "and a stray 'false'; write --flag=false)")
    result = Parsed(tuple(out), parsed.positionals, parsed.help, every)
    return Adopted(result.argv(), tuple(notices), parsed.positionals)


__all__ = ["ACCEPTED", "ALIASES", "BY_NAME", "FOREIGN_FLAGS", "LEGACY_METRICS", "MAPPED", "NATIVE", "Adopted",
           "CompatSettings", "Foreign", "adopt", "add_flags", "engine_of_metric", "kinds_of", "quantity_bytes"]
