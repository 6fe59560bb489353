"""One state-of-the-world EDS stream as a sans-IO machine: fed requests and change ticks, returns what to send.

xDS rules it follows (envoy/api/v3 discovery protocol):
- Every response carries `version_info` (a content hash of the resources sent) and a fresh `nonce`.
- A request whose `response_nonce` is not the latest nonce sent is stale and ignored, except the first request of
  a stream (after a reconnect Envoy may still quote a nonce from the previous server).
- A request quoting the latest nonce with no `error_detail` is an ACK of that version; with `error_detail` it is a
  NACK: it is logged, the rejected version is remembered, and the same version is never sent again on this stream.
  The next different content is sent as usual.
- `resource_names` is the subscription: a change is answered at once; an empty list means no resources (EDS has no
  implicit wildcard); `*` asks for every pool.
- Content changes are pushed without waiting for an ACK of the previous push (allowed by the protocol).
"""

from __future__ import annotations

import logging
from typing import TypeAlias

from envoy.service.discovery.v3 import discovery_pb2

from epp.xds.resources import EDS_TYPE_URL, ResourceTable, version_of

log = logging.getLogger("epp.xds")

Request: TypeAlias = discovery_pb2.DiscoveryRequest
Response: TypeAlias = discovery_pb2.DiscoveryResponse


class EdsStream:
    def __init__(self, table: ResourceTable, peer: str = "") -> None:
        self.table = table
        self.peer = peer
        self.node = ""
        self.names: frozenset[str] | None = None  # None until the first request
        self.last_nonce = ""
        self.sent_version: str | None = None
        self.acked_version = ""
        self.rejected_version: str | None = None
        self.acks = 0
        self.nacks = 0
        self.sent = 0
        self._nonces = 0
        self._warned_unknown: set[str] = set()

    # ---- inputs ------------------------------------------------------------------------------------------
    def on_request(self, req: Request) -> Response | None:
        if req.type_url and req.type_url != EDS_TYPE_URL:
            raise ValueError(f"this stream serves {EDS_TYPE_URL}, not {req.type_url!r}")
        first = self.names is None
        if req.node.id and not self.node:
            self.node = req.node.id
        if not first and req.response_nonce != self.last_nonce:
            log.debug("EDS %s: ignoring a request with stale nonce %r (latest %r)", self.who,
                      req.response_nonce, self.last_nonce)
            return None
        if not first and req.response_nonce:
            self._ack_or_nack(req)
        names = frozenset(req.resource_names)
        if first or names != self.names:
            self.names = names
            log.info("EDS %s subscribed to %s (has version %r)", self.who, sorted(names) or "nothing",
                     req.version_info)
            return self._respond(force=first)
        return self._respond(force=False)

    def on_change(self) -> Response | None:
        """The table changed (or may have): push the subscription's new version, if there is one to push."""
        if self.names is None:
            return None
        return self._respond(force=False)

    # ---- internals ---------------------------------------------------------------------------------------
    @property
    def who(self) -> str:
        return f"node {self.node or '?'} ({self.peer or 'unknown peer'})"

    def _ack_or_nack(self, req: Request) -> None:
        if req.HasField("error_detail"):
            self.nacks += 1
            self.rejected_version = self.sent_version
            log.warning("EDS %s rejected version %s (keeps %r): %s; not resending it", self.who, self.sent_version,
                        req.version_info, req.error_detail.message or f"code {req.error_detail.code}")
            return
        self.acks += 1
        self.acked_version = req.version_info
        log.debug("EDS %s acknowledged version %s", self.who, req.version_info)

    def _respond(self, force: bool) -> Response | None:
        assert self.names is not None
        resources, unknown = self.table.resolve(self.names)
        for name in unknown:
            if name not in self._warned_unknown and self.table.synced:
                self._warned_unknown.add(name)
                log.warning("EDS %s asked for pool %r, which Pointsman does not serve (pools: %s); it gets no "
                            "endpoints", self.who, name, ", ".join(self.table.known()) or "none")
        if not resources:
            return None
        version = version_of(resources)
        if version == self.rejected_version:
            return None
        if version == self.sent_version and not force:
            return None
        self._nonces += 1
        self.last_nonce = str(self._nonces)
        self.sent_version = version
        self.sent += 1
        log.debug("EDS %s <- version %s: %s", self.who, version,
                  ", ".join(f"{r.name}={r.endpoints}" for r in resources))
        return Response(version_info=version, resources=[r.packed for r in resources], type_url=EDS_TYPE_URL,
                        nonce=self.last_nonce)
