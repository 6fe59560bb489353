"""How KV events travel through NATS JetStream (docs/kv-events.md, "The NATS relay"). Pure: no I/O, no nats-py.

One stream per pool, ``POINTSMAN_KV_<POOL>``, over the subjects ``pointsman.kv.<pool>.>``; one subject per engine
rank, ``pointsman.kv.<pool>.<endpoint>.<rank>`` (the endpoint key with ``.`` and ``:`` as ``_``, which NATS
subjects cannot hold). A message is one engine batch, untouched: the data is vLLM's msgpack payload, the headers
carry the rest of the ZMQ message and who sent it:

- ``Pointsman-Endpoint``: the endpoint key as Pointsman names it (``10.0.0.5:8000``);
- ``Pointsman-Rank``: the data-parallel rank;
- ``Pointsman-Seq``: the seq frame in hex (8 bytes big-endian, plus the publisher's stream id when it sends one);
- ``Pointsman-Topic``: the ZMQ topic (may be empty);
- ``Pointsman-Epoch``: how many times the relay has seen this engine rank start afresh (kept across relay
  restarts: read back from the stream's last batch);
- ``Nats-Msg-Id``: endpoint/rank/epoch/stream id/seq, so JetStream drops a batch published twice within its
  duplicate window (a relay that retries or restarts), but not the seq 0 of an engine that restarted.

`frames(headers, data)` turns a message back into the ``[topic, seq, payload]`` frames the subscriber's
`RankStream` reads, so a batch that came through NATS meets the same sequence rules as one read from ZMQ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

H_ENDPOINT = "Pointsman-Endpoint"
H_RANK = "Pointsman-Rank"
H_SEQ = "Pointsman-Seq"
H_TOPIC = "Pointsman-Topic"
H_EPOCH = "Pointsman-Epoch"
H_MSG_ID = "Nats-Msg-Id"
SUBJECT_ROOT = "pointsman.kv"
_TOKEN_OK = re.compile(r"^[A-Za-z0-9_-]+$")


class EnvelopeError(ValueError):
    """A NATS message that is not a relayed KV-event batch; the text says what is missing."""


def _token(value: str, what: str) -> str:
    out = value.replace(".", "_").replace(":", "_").replace("[", "").replace("]", "")
    if not _TOKEN_OK.match(out):
        raise ValueError(f"{what}: {value!r} cannot name a NATS subject (letters, digits, '-', '_', '.', ':')")
    return out


def stream_name(pool: str) -> str:
    """The JetStream stream of a pool's KV events."""
    return "POINTSMAN_KV_" + _token(pool, "pool").upper()


def pool_subjects(pool: str) -> str:
    """Every subject of a pool's stream (the stream's subject filter and a replica's consumer filter)."""
    return f"{SUBJECT_ROOT}.{_token(pool, 'pool')}.>"


def subject(pool: str, endpoint: str, rank: int) -> str:
    return f"{SUBJECT_ROOT}.{_token(pool, 'pool')}.{_token(endpoint, 'endpoint')}.{rank}"


def msg_id(endpoint: str, rank: int, seq_frame: bytes, epoch: int = 0) -> str:
    return f"{endpoint}/{rank}/{epoch}/{seq_frame[8:].hex()}/{int.from_bytes(seq_frame[:8], 'big')}"


def headers(endpoint: str, rank: int, topic: bytes, seq_frame: bytes, epoch: int = 0) -> dict[str, str]:
    return {H_ENDPOINT: endpoint, H_RANK: str(rank), H_SEQ: seq_frame.hex(), H_EPOCH: str(epoch),
            H_TOPIC: topic.decode("utf-8", "replace"), H_MSG_ID: msg_id(endpoint, rank, seq_frame, epoch)}


class Envelope(NamedTuple):
    endpoint: str
    rank: int
    frames: list[bytes]  # [topic, seq frame, payload]


def unwrap(hdrs: Mapping[str, str] | None, data: bytes) -> Envelope:
    """A relayed message → who sent it and its ZMQ frames. Raises EnvelopeError."""
    if not hdrs:
        raise EnvelopeError("no headers")
    endpoint = hdrs.get(H_ENDPOINT)
    if not endpoint:
        raise EnvelopeError(f"no {H_ENDPOINT} header")
    try:
        rank = int(hdrs.get(H_RANK, "0"))
        seq = bytes.fromhex(hdrs.get(H_SEQ, ""))
    except ValueError as e:
        raise EnvelopeError(f"bad {H_RANK} or {H_SEQ} header: {e}") from None
    if not 0 <= rank < 1024:
        raise EnvelopeError(f"{H_RANK} {rank} out of range")
    if len(seq) < 8:
        raise EnvelopeError(f"{H_SEQ} has {len(seq)} bytes; expected 8 or more")
    return Envelope(endpoint, rank, [hdrs.get(H_TOPIC, "").encode(), seq, bytes(data)])


__all__ = ["Envelope", "EnvelopeError", "headers", "msg_id", "pool_subjects", "stream_name", "subject", "unwrap"]
