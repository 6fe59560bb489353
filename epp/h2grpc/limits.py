"""What one client may make the gRPC server spend: every limit of the h2 transport, with its default, in one place.

`ServerLimits` is what `epp serve` builds from its "gRPC server limits" flags (epp/extproc/settings.py) and hands to the server
(`H2Server(limits=...)`; `grpcio_options()` maps the ones grpc.aio has options for). docs/frontdoor.md has the table
with Envoy's and gRPC's comparable defaults; the comments here name them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class ServerLimits:
    # ---- streams -----------------------------------------------------------------------------------------------
    # Open streams per connection, advertised as SETTINGS_MAX_CONCURRENT_STREAMS; more get RST_STREAM REFUSED_STREAM.
    # Envoy's max_concurrent_streams: 1024 (since 1.36); grpc: unlimited.
    max_concurrent_streams: int = 1024
    # Rapid reset (CVE-2023-44487), as Envoy: once a connection opened this many streams, it is closed (GOAWAY
    # ENHANCE_YOUR_CALM) when more than half of them ended prematurely: reset by the client before any response
    # and within `premature_reset_seconds`, refused, or reset by us for a client's protocol error (MadeYouReset).
    # Envoy: overload.premature_reset_total_stream_count 500, min stream lifetime 1 s.
    premature_reset_streams: int = 500
    premature_reset_seconds: float = 1.0

    # ---- frames --------------------------------------------------------------------------------------------------
    # Longest frame payload we accept, advertised as SETTINGS_MAX_FRAME_SIZE; checked on the 9-byte header, before
    # the payload is buffered (FRAME_SIZE_ERROR). RFC 9113 default 16384; grpc 16384; Envoy (nghttp2) 16384.
    max_frame_size: int = 16384
    # Bytes of a header block (HEADERS + CONTINUATION) before HPACK decoding, and of the decoded header list
    # (32 + name + value per field, advertised as SETTINGS_MAX_HEADER_LIST_SIZE): GOAWAY ENHANCE_YOUR_CALM above.
    # grpc: absolute_max_metadata_size 16 KiB; Envoy: max_request_headers_kb 60 KiB.
    max_header_list_bytes: int = 16 * 1024
    # CONTINUATION frames in one header block (nghttp2's fix for the CONTINUATION flood: 8).
    max_continuation_frames: int = 8
    # PING and SETTINGS frames: a token bucket of `max_control_frames` refilled at `control_frames_per_second`;
    # beyond it GOAWAY ENHANCE_YOUR_CALM. Envoy bounds the queued replies instead (max_outbound_control_frames
    # 1000); grpc counts ping strikes (2 pings closer than 5 minutes without data).
    max_control_frames: int = 1000
    control_frames_per_second: float = 100.0
    # WINDOW_UPDATE frames: at most 5 + 2 * (streams opened + N * DATA frames sent) (Envoy's rule and default N 10).
    max_window_updates_per_data_frame: int = 10
    # Consecutive DATA/HEADERS/CONTINUATION frames with an empty payload and no END_STREAM (CVE-2019-9518).
    # Envoy's max_consecutive_inbound_frames_with_empty_payload: 1.
    max_consecutive_empty_frames: int = 1
    # PRIORITY frames: at most N * (1 + streams opened) (Envoy's max_inbound_priority_frames_per_stream: 100).
    max_priority_frames_per_stream: int = 100

    # ---- bytes -------------------------------------------------------------------------------------------------
    # One gRPC message, after inflating a compressed one (RESOURCE_EXHAUSTED above; inflation stops there). A
    # 64 MiB body (the generated Envoy config's buffer limit and --max-body-bytes) plus 1 MiB for the message
    # around it. grpc: max_receive_message_length 4 MiB.
    max_message_bytes: int = 65 * MiB
    # Bytes a connection may hold: request messages being assembled plus replies waiting for the peer's window or
    # socket. Above it the connection's WINDOW_UPDATEs are withheld, and a new message that would not fit is
    # refused (RESOURCE_EXHAUSTED) unless it is the only one being assembled. Envoy bounds buffers per stream
    # (initial_stream_window_size) and per connection (per_connection_buffer_limit_bytes, 1 MiB).
    max_connection_buffer_bytes: int = 64 * MiB
    # The same for all connections of the server (of a worker) together. Above it, a connection gets no more
    # window than its share (this budget over the open connections), and new messages that would not fit are
    # refused. Envoy's overload manager plays this part.
    max_server_buffer_bytes: int = 256 * MiB
    # Replies (and unread requests) queued on one stream above which its WINDOW_UPDATEs are withheld.
    max_stream_buffer_bytes: int = 1 * MiB
    # Receive windows we advertise: per stream (SETTINGS_INITIAL_WINDOW_SIZE) and per connection: what a client
    # may send before we read it, so also what each connection can make us buffer beyond the budgets.
    # Envoy: 16 MiB and 24 MiB (since 1.36; its edge advice: 64 KiB and 1 MiB); grpc: 64 KiB growing with its
    # bandwidth probe.
    initial_stream_window: int = 1 * MiB
    initial_connection_window: int = 2 * MiB
    # Bytes in the socket's write buffer above which we stop reading the connection (asyncio's pause_writing).
    write_buffer_bytes: int = 256 * 1024

    # ---- time and connections --------------------------------------------------------------------------------
    # A new connection must send the HTTP/2 preface and its SETTINGS within this. grpc: 120 s.
    handshake_timeout: float = 10.0
    # A connection without open streams this long is closed (GOAWAY). 0 disables. Envoy's idle_timeout: 1 h;
    # grpc: max_connection_idle infinite.
    idle_timeout: float = 3600.0
    # A connection this old (±10% jitter) gets a graceful GOAWAY: no new streams, the open ones may finish within
    # `max_connection_age_grace`, then the rest are cancelled. Spreads Envoy's long-lived connections over workers
    # and replicas. 0 disables. Envoy's max_connection_duration and grpc's max_connection_age: unset.
    max_connection_age: float = 1800.0
    max_connection_age_grace: float = 600.0
    # Open connections per server (per worker). At the cap, the connection idle the longest is closed to make
    # room; with none idle the new one is refused. Envoy's global_downstream_max_connections and grpc's
    # max_allowed_incoming_connections: unlimited.
    max_connections: int = 4096

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            if getattr(self, f.name) < 0:
                problems.append(f"{f.name} must not be negative")
        if not 16384 <= self.max_frame_size <= (1 << 24) - 1:
            problems.append("max_frame_size must be within 16384..16777215")
        for name in ("initial_stream_window", "initial_connection_window"):
            if not 65535 <= getattr(self, name) <= (1 << 31) - 1:
                problems.append(f"{name} must be within 65535..2147483647")
        for name in ("max_concurrent_streams", "max_connections", "max_message_bytes", "max_header_list_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        if problems:
            raise ValueError("; ".join(problems))


def grpcio_options(limits: ServerLimits) -> list[tuple[str, int]]:
    """The same limits as grpc.aio server options, where grpc has one (see docs/frontdoor.md for what it lacks)."""
    ms = 1000
    opts = [
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_metadata_size", limits.max_header_list_bytes),
        ("grpc.absolute_max_metadata_size", limits.max_header_list_bytes),
        ("grpc.http2.max_frame_size", limits.max_frame_size),
        ("grpc.http2.lookahead_bytes", limits.initial_stream_window),
        ("grpc.server_handshake_timeout_ms", max(1, int(limits.handshake_timeout * ms))),
        # keepalive enforcement: pings need no call in flight (Envoy's keepalive runs on idle connections too),
        # but more often than once a second is a strike, and two strikes end the connection (grpc's default count)
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
    ]
    if limits.idle_timeout:
        opts.append(("grpc.max_connection_idle_ms", int(limits.idle_timeout * ms)))
    if limits.max_connection_age:
        opts.append(("grpc.max_connection_age_ms", int(limits.max_connection_age * ms)))
        opts.append(("grpc.max_connection_age_grace_ms", int(limits.max_connection_age_grace * ms)))
    return opts


# ---- flags (`epp serve`, group "gRPC server limits") ------------------------------------------------------------
_HELP = {
    "max_concurrent_streams": "open streams per connection, advertised; more are refused",
    "premature_reset_streams": "streams a connection opens before more than half of them ending prematurely "
                               "(reset early, refused, or reset for a client error) closes it",
    "premature_reset_seconds": "a client reset before any reply and within this is premature",
    "max_frame_size": "longest frame payload accepted, advertised (16384..16777215)",
    "max_header_list_bytes": "request header block, before and after HPACK decoding",
    "max_continuation_frames": "CONTINUATION frames in one header block",
    "max_control_frames": "PING and SETTINGS frames a connection may send in a burst",
    "control_frames_per_second": "rate at which that burst allowance refills",
    "max_window_updates_per_data_frame": "WINDOW_UPDATEs allowed per DATA frame sent (Envoy's rule)",
    "max_consecutive_empty_frames": "consecutive frames with an empty payload and no END_STREAM",
    "max_priority_frames_per_stream": "PRIORITY frames allowed per stream opened",
    "max_message_bytes": "one gRPC message, also once inflated (65 MiB, or --max-body-bytes + 1 MiB if "
                         "larger)",
    "max_connection_buffer_bytes": "messages being assembled plus replies queued, per connection; windows are "
                                   "withheld above it",
    "max_server_buffer_bytes": "the same for all connections of a worker; over it a connection gets only its "
                               "share of window, and messages that do not fit are refused",
    "max_stream_buffer_bytes": "replies queued (and requests unread) on one stream above which its window is "
                               "withheld",
    "initial_stream_window": "receive window per stream, advertised",
    "initial_connection_window": "receive window per connection",
    "write_buffer_bytes": "unsent bytes in the socket buffer above which the connection is not read",
    "handshake_timeout": "time for a new connection to send its HTTP/2 preface",
    "idle_timeout": "a connection without streams this long is closed; 0 disables",
    "max_connection_age": "graceful GOAWAY at this age (±10%%); 0 disables",
    "max_connection_age_grace": "time open streams get after that GOAWAY",
    "max_connections": "open connections per worker; at the cap the longest idle one is closed",
}
_DURATIONS = ("premature_reset_seconds", "handshake_timeout", "idle_timeout", "max_connection_age",
              "max_connection_age_grace")


def _flag(name: str) -> str:
    return "--grpc-" + name.replace("_", "-")


def add_flags(g: Any, duration: Callable[[str], float]) -> None:
    """One flag per limit (`--grpc-max-concurrent-streams` ...); the defaults are ServerLimits'."""
    defaults = ServerLimits()
    for f in fields(ServerLimits):
        default = getattr(defaults, f.name)
        is_duration = f.name in _DURATIONS
        shown = f"{default:g}s" if is_duration else f"{default:g}" if isinstance(default, float) else f"{default}"
        g.add_argument(_flag(f.name), dest=f"grpc_{f.name}", default=None, type=duration if is_duration else
                       type(default), metavar="DURATION" if is_duration else "N",
                       help=_HELP[f.name] if f.name == "max_message_bytes" else f"{_HELP[f.name]} ({shown})")


def from_args(args: Any) -> ServerLimits:
    """The limits the flags set (ValueError for an impossible one)."""
    given = {f.name: v for f in fields(ServerLimits) if (v := getattr(args, f"grpc_{f.name}", None)) is not None}
    body = getattr(args, "max_body_bytes", None)
    if "max_message_bytes" not in given and body is not None:  # a BUFFERED body is one message
        given["max_message_bytes"] = max(ServerLimits.max_message_bytes, body + MiB)
    return ServerLimits(**given)
