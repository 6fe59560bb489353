"""The settings of `epp serve`'s observability (epp/observe): its flags and the frozen settings they parse into.

Standard library only, so the CLI builds `epp serve`'s flags without loading the tracing, the shadow scheduler or
the request path they observe (those modules import their settings from here, not the reverse).

    tracing   TracingSettings   `--tracing*`: a span per routed request over OTLP (epp/observe/tracing.py)
    receipts  ReceiptSettings   `--receipts`, `--decision-header`: decision ids and receipts (receipts.py, where
                                they and their flags live: that module is all settings)
    shadow    ShadowSettings    `--shadow-*`: another scheduling config decides in shadow (shadow.py)
    logs      LogSettings       `--log-format`, `-v`'s level (logs.py)
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from epp.observe.receipts import ReceiptSettings
from epp.observe.receipts import add_flags as add_receipt_flags

DEFAULT_RATIO = 0.1  # traces sampled when neither --tracing-sample-ratio nor OTEL_TRACES_SAMPLER says
DEFAULT_RATE = 200.0  # shadow decisions per second at most
DEFAULT_MAX_CPU = 0.05  # fraction of loop time the shadow may use
FORMATS = ("text", "json")  # --log-format


@dataclass(frozen=True)
class TracingSettings:
    enabled: bool = False
    protocol: str = "grpc"  # grpc | http/protobuf
    endpoint: str | None = None  # None: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT
    sample_ratio: float | None = None  # None: OTEL_TRACES_SAMPLER, else DEFAULT_RATIO
    service_name: str = "pointsman"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TracingSettings:
        ratio = getattr(ns, "tracing_sample_ratio", None)
        if ratio is not None and not 0.0 <= ratio <= 1.0:
            raise ValueError(f"--tracing-sample-ratio must be between 0 and 1, got {ratio}")
        return cls(enabled=bool(getattr(ns, "tracing", False)),
                   protocol=getattr(ns, "tracing_protocol", None) or default_protocol(),
                   endpoint=getattr(ns, "tracing_endpoint", None) or None, sample_ratio=ratio,
                   service_name=getattr(ns, "tracing_service_name", None) or os.environ.get("OTEL_SERVICE_NAME")
                   or "pointsman")


def default_protocol() -> str:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc").strip()


def add_tracing_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool]) -> None:
    g = p.add_argument_group("tracing (OpenTelemetry; pip install 'pointsman[otel]'; docs/observability.md)")
    g.add_argument("--tracing", type=parse_bool, nargs="?", const=True, default=False,
                   help="export a span per routed request over OTLP (default false); the standard OTEL_* "
                        "environment variables configure the exporter")
    g.add_argument("--tracing-protocol", choices=("grpc", "http/protobuf"), default=None,
                   help="OTLP over gRPC (default) or HTTP (default: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "
                        "$OTEL_EXPORTER_OTLP_PROTOCOL)")
    g.add_argument("--tracing-endpoint", default=None,
                   help="the collector, e.g. http://127.0.0.1:4317 (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
                        "$OTEL_EXPORTER_OTLP_ENDPOINT, then the exporter's localhost default)")
    g.add_argument("--tracing-sample-ratio", type=float, default=None,
                   help="sample this fraction of new traces; a sampled parent is always followed (default: "
                        f"$OTEL_TRACES_SAMPLER, else {DEFAULT_RATIO})")
    g.add_argument("--tracing-service-name", default=None,
                   help="service.name of the spans (default: $OTEL_SERVICE_NAME, else pointsman)")


@dataclass(frozen=True)
class ShadowSettings:
    config_file: str | None = None
    rate: float = DEFAULT_RATE  # shadow decisions per second at most
    max_cpu: float = DEFAULT_MAX_CPU  # fraction of each second of loop time at most
    learn: bool = True

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ShadowSettings:
        rate = getattr(ns, "shadow_rate", DEFAULT_RATE)
        cpu = getattr(ns, "shadow_max_cpu", DEFAULT_MAX_CPU)
        if rate <= 0 or not 0 < cpu <= 1:
            raise ValueError("--shadow-rate must be above 0 and --shadow-max-cpu in (0, 1]")
        return cls(config_file=getattr(ns, "shadow_config", None) or None, rate=rate, max_cpu=cpu,
                   learn=bool(getattr(ns, "shadow_learn", True)))


def add_shadow_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool]) -> None:
    g = p.add_argument_group("shadow profile (docs/observability.md)")
    g.add_argument("--shadow-config", default=None,
                   help="a scheduling config that decides the same requests in shadow, off the reply path, without "
                        "acting (hot-reloaded); its agreement and predicted latency go to /metrics and the dashboard")
    g.add_argument("--shadow-rate", type=float, default=DEFAULT_RATE,
                   help=f"shadow decisions per second at most ({DEFAULT_RATE:g}); past it requests are sampled")
    g.add_argument("--shadow-max-cpu", type=float, default=DEFAULT_MAX_CPU,
                   help=f"fraction of loop time the shadow may use at most ({DEFAULT_MAX_CPU:g})")
    g.add_argument("--shadow-learn", type=parse_bool, default=True,
                   help="the shadow's scorers learn from what really happened (the live pick): true (default)")


@dataclass(frozen=True)
class LogSettings:
    format: str = "text"
    level: int = logging.INFO

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> LogSettings:
        v = getattr(ns, "v", 1)
        level = logging.DEBUG if v >= 3 else logging.INFO if v >= 1 else logging.WARNING
        fmt = getattr(ns, "log_format", "text") or "text"
        if fmt not in FORMATS:
            raise ValueError(f"--log-format must be one of {FORMATS}, got {fmt!r}")
        return cls(format=fmt, level=level)


def add_log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=FORMATS, default="text",
                   help="text (default) or json: one object per line, with decision_id and trace_id on every "
                        "line about a request")


@dataclass(frozen=True)
class ObserveSettings:
    tracing: TracingSettings = field(default_factory=TracingSettings)
    receipts: ReceiptSettings = field(default_factory=ReceiptSettings)
    shadow: ShadowSettings = field(default_factory=ShadowSettings)
    logs: LogSettings = field(default_factory=LogSettings)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ObserveSettings:
        return cls(TracingSettings.from_args(ns), ReceiptSettings.from_args(ns), ShadowSettings.from_args(ns),
                   LogSettings.from_args(ns))


def add_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool],
              parse_duration: Callable[[str], float]) -> None:
    """Every observability flag of `epp serve`, in its group."""
    add_tracing_flags(p, parse_bool)
    add_receipt_flags(p, parse_bool, parse_duration)
    add_shadow_flags(p, parse_bool)
    add_log_flags(p)


__all__ = ["DEFAULT_MAX_CPU", "DEFAULT_RATE", "DEFAULT_RATIO", "FORMATS", "LogSettings",
           "ObserveSettings", "ReceiptSettings", "ShadowSettings", "TracingSettings", "add_flags", "default_protocol"]
