"""The shell's precise prefix index and its KV-event subscriptions, following the datastore's membership.

`PreciseService` owns the `PreciseIndex` for the whole process: it is lent to every loaded scheduler as the
service `precise-index` (`services()`), so a scheduling-config reload keeps what the engines published. Its
subscriber (epp.fleet.kvevents.subscriber, created on the first endpoint that publishes) is the index's writer for
events:

- on every change of the pools (`Datastore.on_change`) the subscriptions are made to match the endpoints that
  publish: each endpoint's own source (the endpoints file's `kvEvents`, the `pointsman.ai/kv-events-*` pod
  annotations), else the port template (--kv-events-port ..., or the scheduling config's llm-d
  `kvEventsConfig` when the command line sets none). An endpoint whose source is invalid is logged once and
  left without a subscription (scored from the approximate index);
- an endpoint that leaves (`Datastore.on_endpoint_removed`: gone from every pool, or its address now another
  pod's) takes its subscription and its index entries with it.

Nothing here blocks: subscribing is asynchronous in ZMQ, so an unreachable publisher is a subscription that never
delivers, and its endpoint stays `pending` (scored from the approximate index).

With `nats_url` (--kv-events-url) the engines' sockets are not used: the subscriber
(epp.fleet.kvevents.jetstream) reads the streams of the datastore's pools, which `epp kv-relay` writes beside each
engine, and the endpoints' own sources and the port template are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from epp.extras import MissingExtra, require
from epp.fleet.datastore import Datastore
from epp.fleet.kvevents.settings import KVEventsSettings
from epp.fleet.kvevents.sources import KVEventsConfigError, KVEventsSource, KVEventsTemplate, source_for
from scheduling.prefix.precise import PreciseIndex
from scheduling.prefix.precise_data import PRECISE_INDEX

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)


class PreciseService:
    def __init__(self, datastore: Datastore, template: KVEventsTemplate | None = None, *, block_size: int = 16,
                 registry: CollectorRegistry | None = None, replay_timeout: float = 1.0, catch_up_after: float | None = 0.5,
                 nats_url: str | None = None) -> None:
        self.datastore = datastore
        self.index = PreciseIndex(block_size=block_size)
        self.template = template  # the command line's
        self.config_template: KVEventsTemplate | None = None  # the scheduling config's (llm-d kvEventsConfig)
        self.registry = registry
        self.replay_timeout = replay_timeout
        self.catch_up_after = catch_up_after
        self.nats_url = nats_url  # the pools' JetStream streams instead of the engines' sockets
        self.subscriber: Any = None  # epp.fleet.kvevents.subscriber.KVEventSubscriber, once an endpoint publishes
        self.invalid: dict[str, str] = {}  # endpoint key -> why its KV-events source is invalid
        self._attached = False
        self._missing: str | None = None  # why there can be no subscriber (an extra is not installed), once logged

    @classmethod
    def from_settings(cls, settings: KVEventsSettings, datastore: Datastore, registry: CollectorRegistry | None = None) -> PreciseService:
        return cls(datastore, settings.template, block_size=settings.block_size, registry=registry,
                   nats_url=settings.nats_url)

    def services(self) -> dict[str, Any]:
        """What the shell lends each loaded scheduler."""
        return {PRECISE_INDEX: self.index}

    def attach(self) -> None:
        """Follow the datastore from now on (and subscribe to what it already holds)."""
        if self._attached:
            return
        self._attached = True
        ds = self.datastore
        ds.on_endpoint_removed(self.endpoint_removed)
        ds.on_change(lambda _pool: self.sync())
        self.sync()

    @property
    def effective_template(self) -> KVEventsTemplate | None:
        return self.template if self.template is not None else self.config_template

    def apply_config(self, scheduler: object) -> None:
        """A scheduler was loaded: take the port template of its llm-d kvEventsConfig (when the command line sets
        none) and resubscribe accordingly."""
        found: KVEventsTemplate | None = None
        for plugin in getattr(scheduler, "plugins", list)():
            hint = getattr(plugin, "kv_events_template", None)
            if hint is None:
                continue
            port, topic = hint()
            if port is not None:
                found = KVEventsTemplate(port, None, topic or "")
                break
        if found != self.config_template:
            self.config_template = found
            if self._attached:
                self.sync()

    def sources(self, endpoints: Iterable[Any]) -> dict[str, KVEventsSource]:
        out: dict[str, KVEventsSource] = {}
        template = self.effective_template
        for ep in endpoints:
            try:
                src = source_for(ep, template)
            except KVEventsConfigError as e:
                if self.invalid.get(ep.key) != str(e):
                    log.error("endpoint %s: no KV-event subscription: %s", ep.key, e)
                self.invalid[ep.key] = str(e)
                continue
            self.invalid.pop(ep.key, None)
            if src is not None:
                out[ep.key] = src
        return out

    def sync(self) -> None:
        """Make the subscriptions match the datastore's endpoints (over NATS: its pools)."""
        if self.nats_url is not None:
            pools = self.datastore.pool_names()
            if pools or self.subscriber is not None:
                self._subscriber().follow(pools)
            return
        sources = self.sources(self.datastore.all_endpoints())
        if not sources and self.subscriber is None:
            return
        try:
            sub = self._subscriber()
        except MissingExtra as e:  # the endpoints are scored from the approximate index, as for a bad source
            if self._missing != str(e):
                log.error("no KV-event subscriptions for %d endpoint(s): %s", len(sources), e)
                self._missing = str(e)
            self.invalid.update(dict.fromkeys(sources, str(e)))
            return
        for key in [k for k in sub.sources() if k not in sources]:
            sub.remove_endpoint(key)
        for key, src in sources.items():
            try:
                sub.add_endpoint(key, src)
            except ValueError as e:  # a ZMQ address it cannot even parse
                if self.invalid.get(key) != str(e):
                    log.error("endpoint %s: %s", key, e)
                self.invalid[key] = str(e)

    def endpoint_removed(self, key: str) -> None:
        self.invalid.pop(key, None)
        if self.subscriber is not None:
            self.subscriber.remove_endpoint(key)  # also forgets the endpoint in the index
        else:
            self.index.forget(key)

    def _subscriber(self) -> Any:
        if self.subscriber is None:
            for module in ("zmq", "msgpack"):
                require("precise", module, "subscribing to KV events")
            from epp.fleet.kvevents.metrics import KVEventMetrics

            metrics = KVEventMetrics(self.registry) if self.registry is not None else None
            if self.nats_url is not None:
                from epp.fleet.kvevents.jetstream import JetStreamKVSubscriber
                from epp.natsconn import NatsTarget

                require("precise", "nats", "reading KV events from NATS")
                self.subscriber = JetStreamKVSubscriber(self.index, NatsTarget.parse(self.nats_url), metrics)
                return self.subscriber
            from epp.fleet.kvevents.subscriber import KVEventSubscriber

            self.subscriber = KVEventSubscriber(self.index, metrics, replay_timeout=self.replay_timeout,
                                                catch_up_after=self.catch_up_after)
        return self.subscriber

    def status(self) -> Mapping[str, Any]:
        """Per endpoint: its index state and subscription (for tests and the dashboard)."""
        subs = self.subscriber.status() if self.subscriber is not None else {}
        return {"states": self.index.states(), "subscriptions": subs, "invalid": dict(self.invalid)}

    async def close(self) -> None:
        if self.subscriber is not None:
            await self.subscriber.close()
