"""Replication of plugin state between Pointsman processes: the plugin side (pure; the shell moves the bytes).

Several Pointsman processes (replicas behind one gateway, or the workers of one pod) each run their own scheduler.
What one of them learns from its own picks (the prefix blocks it sent to an endpoint, the session it bound, the
prefill backlog it queued) is replicated to the others through two small interfaces:

- `ReplicatedRecords`: idempotent records. `export_records(now)` hands out what was produced since the last call
  (only while `set_replicating(True)`: nothing accumulates when nobody replicates); a peer's records are given to
  `apply_records(peer, records, now)`. Applying a record twice is harmless and losing one costs a little accuracy.
  Prefix blocks of a pick and session bindings are records. A peer that joins (or restarts) gets
  `snapshot_records(now)`, a bounded set of recent records, so it does not start from nothing.
- `ReplicatedState`: absolute per-endpoint values. `export_state(now)` is this process's own contribution as of
  `now`; `apply_peer_state(peer, values, now)` replaces that peer's previous values (None: the peer is gone, forget
  all it contributed). The prefill backlog is state.

Wire contract (the shell relies on it): every record is a list whose first element is an endpoint key ("ip:port"),
followed by plain msgpack-able values; state maps endpoint keys to finite numbers. The shell drops records and
values for endpoints its datastore does not know before calling `apply_*` (a plugin never creates state for an
unknown endpoint: the endpoint lifecycle invariant), and plugins validate the rest: malformed records are skipped
and counted in the return value of `apply_records`.

`replicated(scheduler)` lists the replicated plugins of a loaded scheduler under channel names that are equal in
every process that loaded the same configuration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from scheduling.framework.model_scheduler import ModelScheduler

Record = list[Any]  # [endpoint key, ...values]
T = TypeVar("T")


def drain(outbox: deque[T] | None) -> list[T]:
    """What a plugin's outbox holds, oldest first, leaving it empty (nothing while not replicating)."""
    if not outbox:
        return []
    out = list(outbox)
    outbox.clear()
    return out


@runtime_checkable
class ReplicatedRecords(Protocol):
    def replication_key(self) -> str:
        """What the records mean, including every parameter that changes it (e.g. "approx-prefix/16")."""
        ...

    def set_replicating(self, on: bool) -> None:
        """Start (True) or stop (False) collecting records for `export_records`."""
        ...

    def export_records(self, now: float) -> list[Record]:
        """The records produced since the last call (empty when not replicating); `now` is the exporter's clock."""
        ...

    def snapshot_records(self, now: float) -> list[Record]:
        """A bounded set of recent records, with times as of `now`, for a peer that just joined (replay)."""
        ...

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        """Apply a peer's records (endpoints already checked by the shell); returns how many were malformed."""
        ...


@runtime_checkable
class ReplicatedState(Protocol):
    def replication_key(self) -> str: ...

    def export_state(self, now: float) -> dict[str, float]:
        """This process's own absolute values per endpoint, as of `now`."""
        ...

    def apply_peer_state(self, peer: str, values: Mapping[str, float] | None, now: float) -> None:
        """Replace `peer`'s values (received at `now`); None forgets everything the peer contributed."""
        ...


def replicated(scheduler: ModelScheduler) -> tuple[dict[str, ReplicatedRecords], dict[str, ReplicatedState]]:
    """The replicated plugins of `scheduler` as ({channel: records plugin}, {channel: state plugin}).

    A channel is "<config>/<plugin name>:<replication key>", where <config> is "profile:<name>" for a named
    SchedulingProfile and "config" for the EndpointPickerConfig (or the built-in default); a plugin shared by
    several configs is listed once, under the first."""
    records: dict[str, ReplicatedRecords] = {}
    states: dict[str, ReplicatedState] = {}
    seen: set[int] = set()
    configs = [("config", scheduler.fallback)]
    configs += [(f"profile:{name}", sched) for name, sched in sorted(scheduler.schedulers.items())]
    for label, sched in configs:
        for plugin in sched.plugins():
            if id(plugin) in seen:
                continue
            seen.add(id(plugin))
            if isinstance(plugin, ReplicatedRecords):
                records[f"{label}/{plugin.name}:{plugin.replication_key()}"] = plugin
            if isinstance(plugin, ReplicatedState):
                states[f"{label}/{plugin.name}:{plugin.replication_key()}"] = plugin
    return records, states


def is_count(v: object, limit: int = 2**64) -> bool:
    """A non-negative int below `limit` (bools are not counts): for validating received records."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit
