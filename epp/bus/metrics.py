"""Prometheus metrics of the replica bus, computed from its counters at scrape time.

- pointsman_bus_messages_published_total                       messages this process published
- pointsman_bus_messages_received_total{kind}                  messages accepted, by kind (load, records)
- pointsman_bus_messages_dropped_total{reason}                 messages dropped: malformed, auth, unknown-peer,
                                                               stale, unknown-channel, error, send-queue-full,
                                                               name-clash; over NATS also disconnected (not sent
                                                               while the server was unreachable), slow-consumer
- pointsman_bus_records_dropped_total{reason}                  records not applied: unknown-endpoint, malformed
- pointsman_bus_entries_ignored_total                          load/state entries for endpoints not known here
- pointsman_bus_replays_total                                  snapshots replayed to peers that joined
- pointsman_bus_peers / pointsman_bus_live_peers               peers configured (over NATS: heard) / heard from
                                                               within the ttl
- pointsman_bus_connected                                      1 while the transport can send (the mesh always;
                                                               NATS while connected to a server)

With `--workers N` every worker has its own bus; the series carry a `worker` label then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from epp.bus.shell import BusRuntime


class BusCollector(Collector):
    def __init__(self, runtime: BusRuntime, worker: int | None = None) -> None:
        self.runtime = runtime
        self.extra = [] if worker is None else [str(worker)]
        self.labels = [] if worker is None else ["worker"]

    def _counter(self, name: str, doc: str, by: str | None = None) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=[*self.labels, *([by] if by else [])])

    def collect(self) -> Iterator[Metric]:
        bus, repl = self.runtime.bus, self.runtime.replication
        x = self.extra
        pub = self._counter("pointsman_bus_messages_published", "Replica bus messages published.")
        pub.add_metric(x, bus.published)
        rec = self._counter("pointsman_bus_messages_received", "Replica bus messages accepted, by kind.", "kind")
        for kind in ("load", "records"):
            rec.add_metric([*x, kind], bus.received[kind])
        drop = self._counter("pointsman_bus_messages_dropped", "Replica bus messages dropped, by reason.", "reason")
        for reason, n in sorted(bus.dropped.items()):
            drop.add_metric([*x, reason], n)
        rdrop = self._counter("pointsman_bus_records_dropped", "Replicated records not applied, by reason.",
                              "reason")
        for reason in ("unknown-endpoint", "malformed"):
            rdrop.add_metric([*x, reason], repl.dropped[reason])
        ignored = self._counter("pointsman_bus_entries_ignored",
                                "Shared load and state entries for endpoints this process does not know.")
        ignored.add_metric(x, bus.ignored)
        replays = self._counter("pointsman_bus_replays", "Record snapshots replayed to peers that joined.")
        replays.add_metric(x, bus.replays)
        peers = GaugeMetricFamily("pointsman_bus_peers", "Replica bus peers configured.", labels=self.labels)
        peers.add_metric(x, len(bus.peers))
        live = GaugeMetricFamily("pointsman_bus_live_peers", "Replica bus peers heard from within the ttl.",
                                 labels=self.labels)
        live.add_metric(x, len(bus.live_peers()))
        connected = GaugeMetricFamily("pointsman_bus_connected", "1 while the replica bus's transport can send.",
                                      labels=self.labels)
        connected.add_metric(x, 1 if bus.transport.connected else 0)
        yield from (pub, rec, drop, rdrop, ignored, replays, peers, live, connected)


def register_bus_metrics(registry: CollectorRegistry, runtime: BusRuntime, worker: int | None = None) -> None:
    registry.register(BusCollector(runtime, worker))
