"""The shell adapter between the replica bus and the scheduler's replicated plugins.

`attach(scheduler)` wires every replicated plugin of the current scheduler (scheduling.framework.replication) to
the bus: a records channel per `ReplicatedRecords` plugin (its exports, its snapshot for peers that join, and a
sink applying peers' records), a state per `ReplicatedState` plugin. A hot reload calls `attach` again with the new
scheduler: the old plugins stop collecting and are unwired, the new ones start from what peers send next (their
state within one heartbeat; records as peers pick, plus the peers' snapshots when they see this process anew).

The lifecycle invariant holds at the door: a record or a value for an endpoint this process's datastore does not
know is dropped here and counted (`dropped["unknown-endpoint"]`), so a peer can never create plugin state for an
endpoint outside this process's pools. Records that are not a list starting with an endpoint key, and those the
plugin finds malformed, are counted in `dropped["malformed"]`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from epp.bus.bus import ReplicaBus
from epp.fleet import Datastore
from scheduling.framework.model_scheduler import ModelScheduler
from scheduling.framework.replication import ReplicatedRecords, ReplicatedState, replicated

log = logging.getLogger(__name__)


class Replication:
    def __init__(self, bus: ReplicaBus, datastore: Datastore, clock: Callable[[], float] = time.monotonic) -> None:
        self.bus = bus
        self.datastore = datastore
        self.clock = clock
        self.dropped: Counter[str] = Counter()  # records not applied, by reason
        self.applied: Counter[str] = Counter()  # records applied, by channel
        self._records: dict[str, ReplicatedRecords] = {}
        self._states: dict[str, ReplicatedState] = {}

    def attach(self, scheduler: ModelScheduler) -> None:
        """Replicate `scheduler`'s plugins (instead of the previous scheduler's)."""
        for name, plugin in self._records.items():
            plugin.set_replicating(False)
            self.bus.remove_channel(name)
        for name in self._states:
            self.bus.remove_state(name)
        self._records, self._states = replicated(scheduler)
        for name, rp in self._records.items():
            rp.set_replicating(True)
            self.bus.add_channel(name, self._source(rp), self._sink(name, rp), snapshot=self._snapshot(rp))
        for name, sp in self._states.items():
            self.bus.add_state(name, self._state_source(sp), self._state_sink(sp))
        log.info("replica bus: replicating %s", ", ".join([*self._records, *self._states]) or "nothing")

    def channels(self) -> list[str]:
        return sorted([*self._records, *self._states])

    # ---- adapters ------------------------------------------------------------------------------------------
    def _source(self, plugin: ReplicatedRecords) -> Callable[[], list[Any]]:
        return lambda: plugin.export_records(self.clock())

    def _snapshot(self, plugin: ReplicatedRecords) -> Callable[[], list[Any]]:
        return lambda: plugin.snapshot_records(self.clock())

    def _sink(self, name: str, plugin: ReplicatedRecords) -> Callable[[str, list[Any]], None]:
        def sink(peer: str, items: list[Any]) -> None:
            known = self.datastore.members()
            kept = []
            for item in items:
                if not isinstance(item, list) or not item or not isinstance(item[0], str):
                    self.dropped["malformed"] += 1
                elif item[0] not in known:
                    self.dropped["unknown-endpoint"] += 1
                else:
                    kept.append(item)
            if kept:
                bad = plugin.apply_records(peer, kept, self.clock())
                self.dropped["malformed"] += bad
                self.applied[name] += len(kept) - bad

        return sink

    def _state_source(self, plugin: ReplicatedState) -> Callable[[], dict[str, float]]:
        return lambda: plugin.export_state(self.clock())

    def _state_sink(self, plugin: ReplicatedState) -> Callable[[str, dict[str, float] | None], None]:
        # The bus has already dropped values for endpoints the datastore does not know (ReplicaBus.known).
        return lambda peer, values: plugin.apply_peer_state(peer, values, self.clock())
