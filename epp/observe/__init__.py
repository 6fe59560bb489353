"""Seeing every decision: OpenTelemetry traces, decision receipts, shadow profiles and structured logs.

    tracing.py       `--tracing`: a span per request with child spans per stage (TracedExchange, TracingObserver)
    attributes.py    the request span's attributes
    batching.py      the bounded queue and thread between finished traces and the exporter (OTEL_BSP_*)
    wire.py          the OTLP encoder: a batch of traces straight to protobuf bytes
    otlp.py          the SDK's OTLP exporters (gRPC, HTTP) with wire.py's encoder in their translation hooks
    receipts.py      decision ids in replies and the access log; `epp explain --decision ID`; the gRPC GetReceipt
    shadow.py        `--shadow-config`: another scheduling config decides in shadow; agreement, latency, moves
    logs.py          `--log-format json` with the decision and trace ids
    settings.py      the flags and settings of all of the above (standard library only: the CLI reads them)
    observability.py `Observability`, what `epp serve` wires

W3C traceparent / tracestate parsing (from the stream's gRPC metadata or the request's headers) is the request
path's own: epp/request/tracecontext.py. Everything here is a request observer (epp/request/observe.py) or reads the exchange, except what the exchange
itself carries: the decision id (epp/request/director.py `DecisionIds`) and, with tracing, its stage marks
(`TracedExchange`). `add_flags` registers the flags of `epp serve`; `Observability` is what the app wires
(docs/observability.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.observe.logs import configure
    from epp.observe.observability import Observability
    from epp.observe.settings import (
        LogSettings,
        ObserveSettings,
        ReceiptSettings,
        ShadowSettings,
        TracingSettings,
        add_flags,
    )
    from epp.observe.shadow import Shadow
    from epp.observe.tracing import Tracing, TracingObserver

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "configure": "logs",
    "Observability": "observability",
    "LogSettings": "settings", "ObserveSettings": "settings", "ReceiptSettings": "settings",
    "ShadowSettings": "settings", "TracingSettings": "settings", "add_flags": "settings",
    "Shadow": "shadow",
    "Tracing": "tracing", "TracingObserver": "tracing",
}

__all__ = ["LogSettings", "Observability", "ObserveSettings", "ReceiptSettings", "Shadow", "ShadowSettings",
           "Tracing", "TracingObserver", "TracingSettings", "add_flags", "configure"]


__getattr__ = lazy_exports(__name__, _LAZY)
