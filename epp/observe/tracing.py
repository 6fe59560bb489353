"""OpenTelemetry traces of routed requests (`epp serve --tracing`): one span per request, joined to the gateway's trace.

Parent: the trace context Envoy's ext_proc filter puts in the stream's gRPC metadata when Envoy traces (the
context of its `async envoy.service.ext_proc.v3.ExternalProcessor.Process egress` span), else the client's
`traceparent` / `tracestate` request headers, else none (a new trace). Sampling is the SDK's: `--tracing-sample-ratio
R` is ParentBased(TraceIdRatioBased(R)) (a sampled parent is always followed, an unsampled one never); without the
flag the standard OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG apply, and without those the ratio is 0.1.

    pointsman.request      SERVER, from the decision's start to the stream's end
      pointsman.admit      the admitters, when there are more than the built-in saturation check (rate limits,
                           budgets: they may wait for Redis) or when admission refused the request
      pointsman.tokenize   when the config reads token ids and the request was tokenized
      pointsman.queue      when flow control is on: the time held in its queue
      pointsman.schedule   the scheduler's run

The request span's attributes (built only for a sampled request, bounded: at most MAX_SCORERS scorers) are the
decision id, the pool, model and target model, the scheduling config and profile run, the pick, the runner-up and
the margin between their totals, each scorer's score for the pick, the candidate count and the route; when the stream
ends, the HTTP status, the first response byte as Pointsman saw it (`gen_ai.response.time_to_first_chunk` for an
event stream) and the usage the response reported (`gen_ai.usage.*`). A rejected request's span carries
`error.type` (the inference error code) and an error status.

Cost. Off (the default) nothing here is imported and a request pays one attribute check (`Director.tracing`). On,
`TracedExchange` decides sampling once per request (the configured ratio sampler in place: a random 64-bit draw
against the SDK's bound); only a sampled request stamps when each stage begins: its trace's marks are handed to
the exchange's one stage loop (`RequestExchange.marks`), which stamps them, so the stage order is stated only there
(`STAGE_NAMES`). When its stream ends the request's
attributes and stage spans are gathered into one record, a plain tuple (`record`), which the loop's encoder writes
at once as OTLP bytes (epp/observe/wire.py; the stage spans' ids are drawn there), and those bytes join the export
queue (epp/observe/batching.py: a lock and an append). No SDK span object is made: the SDK's live `Span` (a lock,
bounded attributes, the sampler again for every child) costs about 20 µs each; its `ReadableSpan`s and
BatchSpanProcessor, which this used before, cost about as much again as the whole record path. The batch thread
hands a batch of encoded traces to the SDK's OTLP exporter, whose translation hook only frames them
(epp/observe/otlp.py). docs/observability.md "Performance" has the measurements.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from random import getrandbits
from typing import TYPE_CHECKING, Any

from epp.observe.attributes import marks_start, request_attributes
from epp.observe.settings import DEFAULT_RATIO, TracingSettings
from epp.protocol import Outcome
from epp.request import STAGE_NAMES, UNSAMPLED, RequestExchange, TraceParent, find_parent

if TYPE_CHECKING:
    from opentelemetry.trace import TraceState

    from epp.observe.batching import Exporter
    from epp.request import Director, Usage

log = logging.getLogger("epp.tracing")

ROOT = "pointsman.request"
ADMIT, PREPARE, QUEUE, SCHEDULE = (STAGE_NAMES.index(n) for n in ("admit", "prepare", "queue", "schedule"))
DONE = len(STAGE_NAMES)  # the mark of the decision's end
CHILDREN = ((ADMIT, "pointsman.admit"), (PREPARE, "pointsman.tokenize"), (QUEUE, "pointsman.queue"),
            (SCHEDULE, "pointsman.schedule"))


class Trace:
    """One sampled request's trace: ids, the stage marks, what the response showed. It is the request's follow."""

    __slots__ = ("tracing", "trace_id", "span_id", "parent_id", "state", "source", "wall0", "perf0", "marks",
                 "status", "served", "first_byte", "done")

    def __init__(self, tracing: Tracing, trace_id: int, span_id: int, parent: TraceParent | None, state: TraceState | None,
                 source: str) -> None:
        self.tracing = tracing
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent.span_id if parent is not None else 0
        self.state = state  # the sampler's TraceState for the spans
        self.source = source  # where the parent came from: envoy | client | "" (a new trace)
        self.wall0 = time.time_ns()
        self.perf0 = time.perf_counter_ns()
        self.marks = [0] * (DONE + 1)
        self.status = 0
        self.served: str | None = None
        self.first_byte = 0
        self.done = False

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def wall(self, perf_ns: int) -> int:
        return self.wall0 + (perf_ns - self.perf0)

    # ---- the follow (epp/request/observe.py) -----------------------------------------------------------------
    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        self.status = status
        self.served = served

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        if size and not self.first_byte:
            self.first_byte = time.perf_counter_ns()

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        self.tracing.finish(ex, self, usage=usage)


class TracedExchange(RequestExchange):
    """A request exchange that asks the sampler when the decision starts and, for a sampled request, stamps when
    each stage begins (`Trace.marks`, perf_counter nanoseconds)."""

    __slots__ = ("trace", "_tracing", "_stream_md")

    def __init__(self, director: Director, tracing: Tracing, stream_metadata: Sequence[tuple[Any, Any]] | None
                 ) -> None:
        super().__init__(director)
        self.trace: Trace | None = None
        self._tracing = tracing
        self._stream_md = stream_metadata

    def decide(self, headers: Mapping[str, str], body: bytes | memoryview | None, metadata: Mapping[str, Mapping[str, object]]) -> Outcome | Awaitable[Outcome]:
        md, self._stream_md = self._stream_md, None
        try:
            self.trace = trace = self._tracing.begin(md, headers)
            if trace is not None:
                self.marks = trace.marks  # the exchange's one stage loop stamps when each stage begins
        except Exception:  # tracing never fails a request
            log.exception("starting a trace failed")
        return super().decide(headers, body, metadata)

    def close(self) -> None:
        super().close()
        trace = self.trace
        if trace is not None and not trace.done:  # the client went away before a decision or a rejection
            self._tracing.finish(self, trace, error="Cancelled")


class Tracing:
    """The SDK pieces tracing uses: the sampler, id generator and resource of a TracerProvider configured from
    the settings and the OTEL_* variables, and a BatchSpanProcessor around the OTLP exporter."""

    def __init__(self, settings: TracingSettings, exporter: Exporter | None = None) -> None:
        from epp.observe.otlp import TracingUnavailable, check_proto

        try:
            from opentelemetry import trace as api
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
            from opentelemetry.trace.span import NonRecordingSpan, SpanContext, TraceFlags, TraceState
        except ImportError as e:
            raise TracingUnavailable(f"--tracing needs the OpenTelemetry SDK: pip install 'pointsman[otel]' "
                                     f"({e})") from e
        from epp.observe.batching import Batcher
        from epp.observe.wire import Batch, Encoder, Origin

        if exporter is None:
            check_proto()
            from epp.observe.otlp import exporter as make_exporter

            exporter = make_exporter(settings.protocol, settings.endpoint)
        sampler = None
        ratio = settings.sample_ratio
        if ratio is None and not os.environ.get("OTEL_TRACES_SAMPLER"):
            ratio = DEFAULT_RATIO
        if ratio is not None:
            sampler = ParentBased(TraceIdRatioBased(ratio))
        provider = TracerProvider(sampler=sampler, resource=Resource.create({SERVICE_NAME: settings.service_name}))
        self.settings = settings
        self.sampler = provider.sampler
        # ParentBased(TraceIdRatioBased(ratio)), decided here without the SDK's per-call objects: a remote parent's
        # sampled flag; for a new trace, the trace id's low 64 bits below the ratio's bound (the SDK's own rule and
        # bound). An OTEL_TRACES_SAMPLER sampler is asked as it is.
        self.bound = TraceIdRatioBased.get_bound_for_rate(ratio) if ratio is not None else None
        self.id_generator = provider.id_generator
        self.new_span_id = self.id_generator.generate_span_id
        self.resource = provider.resource
        self.scope = InstrumentationScope("pointsman", _version())
        self.origin = Origin(self.resource, self.scope)
        self.encoder = Encoder(self.new_span_id, ROOT)  # the event loop's: each trace is encoded as it finishes
        self.processor = Batcher(exporter, wrap=lambda traces, spans: Batch(traces, self.origin, spans))
        self._api, self._ctx_cls = api, SpanContext
        self._nonrecording, self._flags, self._state_cls = NonRecordingSpan, TraceFlags, TraceState
        self._server = api.SpanKind.SERVER

    def exchange(self, director: Director, stream_metadata: Sequence[tuple[Any, Any]] | None) -> TracedExchange:
        return TracedExchange(director, self, stream_metadata)

    # ---- per request --------------------------------------------------------------------------------------------
    def begin(self, stream_metadata: Sequence[tuple[Any, Any]] | None, headers: Mapping[str, str]
              ) -> Trace | None:
        """The sampler's decision for a new request: its Trace when sampled, else None."""
        bound = self.bound
        # Sampling first: an unsampled parent is known by its flags, its ids and state left unparsed.
        parent, source = find_parent(stream_metadata, headers, sampled_only=bound is not None)
        if bound is not None:  # the configured ParentBased(TraceIdRatioBased) sampler, decided in place
            if parent is not None:
                if parent is UNSAMPLED:
                    return None
                state = self._state_cls.from_header([parent.tracestate]) if parent.tracestate else None
                return Trace(self, parent.trace_id, self.id_generator.generate_span_id(), parent, state, source)
            low = getrandbits(64)
            if low >= bound:
                return None
            return Trace(self, (getrandbits(64) << 64 | low) or 1, self.id_generator.generate_span_id(), None,
                         None, "")
        if parent is None:
            trace_id, context, source = self.id_generator.generate_trace_id(), None, ""
        else:
            trace_id = parent.trace_id
            state = self._state_cls.from_header([parent.tracestate]) if parent.tracestate else None
            sc = self._ctx_cls(trace_id, parent.span_id, True, self._flags(parent.flags & 0xFF), state)
            context = self._api.set_span_in_context(self._nonrecording(sc))
        result = self.sampler.should_sample(context, trace_id, ROOT, self._server)
        if not result.decision.is_sampled():
            return None
        return Trace(self, trace_id, self.id_generator.generate_span_id(), parent, result.trace_state, source)

    def finish(self, ex: RequestExchange, trace: Trace, *, usage: Usage | None = None, error: str = "") -> None:
        """Complete the request's trace (its end, attributes and stage spans) and queue it for export (once)."""
        if trace.done:
            return
        trace.done = True
        end = time.perf_counter_ns()
        marks = trace.marks
        if not marks[DONE]:
            marks[DONE] = end
        try:
            attributes = request_attributes(ex, trace, usage, error)
            children = []
            d = ex.d
            for stage, name in CHILDREN:
                start = marks[stage]
                if not start or not _child_wanted(stage, d, ex, error):
                    continue
                stop = end
                for m in marks[stage + 1:]:
                    if m:
                        stop = m
                        break
                children.append((name, start, stop))
            encoded = self.encoder.trace(record(trace, marks_start(trace), end, attributes, children, error))
            self.processor.emit(encoded, 1 + len(children))
        except Exception:
            log.exception("building a trace failed")

    def shutdown(self) -> None:
        """Flush what is queued and stop the exporter (blocking: call it from a thread)."""
        self.processor.shutdown()


def record(trace: Trace, start: int, end: int, attributes: dict[str, Any], children: Sequence[tuple[str, int, int]],
           error: str = "") -> tuple[Any, ...]:
    """A finished trace as the encoder reads it (epp/observe/wire.py `Encoder.trace`): a plain tuple of plain values
    (ids, the state header, the wall clock's offset from perf_counter, perf_counter start and end, the error code,
    the HTTP status, the attributes' keys and values, the children as (name, start, end))."""
    state = trace.state.to_header() if trace.state else ""
    return (trace.trace_id, trace.span_id, trace.parent_id, state, trace.wall0 - trace.perf0, start, end, error,
            trace.status, tuple(attributes), tuple(attributes.values()), tuple(children))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pointsman")
    except PackageNotFoundError:
        return ""


def _child_wanted(stage: int, d: Director, ex: RequestExchange, error: str) -> bool:
    if stage == ADMIT:  # the built-in saturation check alone takes a microsecond: not worth a span
        return len(d.admitters) > 1 or (bool(error) and not ex.trace.marks[PREPARE])
    if stage == PREPARE:
        req = ex.request
        return d.tokens is not None and req is not None and bool(req.token_source)
    if stage == QUEUE:
        return d.flow is not None
    if stage == SCHEDULE:
        return ex.result is not None
    return True


class TracingObserver:
    """The request observer (epp/request/observe.py) that ends the spans: a decided request's trace follows the
    response; a rejected one ends at once."""

    __slots__ = ()

    def decided(self, ex: RequestExchange) -> Trace | None:
        trace: Trace | None = ex.trace
        if trace is None:
            return None
        trace.marks[DONE] = time.perf_counter_ns()
        return trace

    def rejected(self, ex: RequestExchange, code: str) -> None:
        trace = ex.trace
        if trace is not None:
            trace.tracing.finish(ex, trace, error=code)
