"""What the replica bus carries besides in-flight load: named record channels (idempotent records, with an optional
snapshot of recent ones for peers that join) and named plugin states (absolute per-endpoint values), each with the
source that produces this process's side and the sink that takes a peer's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from epp.bus.codec import BusMessageError

RecordSource = Callable[[], list[Any]]  # records produced since the last call
RecordSink = Callable[[str, list[Any]], None]  # (peer, records)
RecordSnapshot = Callable[[], list[Any]]  # recent records, for a peer that joined
StateSource = Callable[[], dict[str, float]]  # absolute per-endpoint values of this process
StateSink = Callable[[str, "dict[str, float] | None"], None]  # (peer, values, or None when the peer expired)
Entries = Callable[[Mapping[str, Any]], list[tuple[str, Any]]]  # the entries this process keeps


class Channels:
    def __init__(self) -> None:
        self._records: dict[str, tuple[RecordSource, RecordSink]] = {}
        self._snapshots: dict[str, RecordSnapshot] = {}
        self._states: dict[str, tuple[StateSource, StateSink]] = {}

    # ---- wiring ------------------------------------------------------------------------------------------
    def add_channel(self, name: str, source: RecordSource, sink: RecordSink,
                    snapshot: RecordSnapshot | None = None) -> None:
        self._records[name] = (source, sink)
        if snapshot is not None:
            self._snapshots[name] = snapshot

    def add_state(self, name: str, source: StateSource, sink: StateSink) -> None:
        self._states[name] = (source, sink)

    def remove_channel(self, name: str) -> None:
        self._records.pop(name, None)
        self._snapshots.pop(name, None)

    def remove_state(self, name: str) -> None:
        self._states.pop(name, None)

    def channels(self) -> list[str]:
        return sorted(self._records)

    def states(self) -> list[str]:
        return sorted(self._states)

    @property
    def has_snapshots(self) -> bool:
        return bool(self._snapshots)

    # ---- this process's side -------------------------------------------------------------------------------
    def new_records(self) -> Iterator[tuple[str, list[Any]]]:
        """Each channel's records produced since the last call."""
        for name, (source, _) in list(self._records.items()):
            yield name, source()

    def snapshot_records(self) -> Iterator[tuple[str, list[Any]]]:
        """Each channel's recent records, for peers that joined."""
        for name, snapshot in list(self._snapshots.items()):
            yield name, snapshot()

    def state_values(self) -> dict[str, dict[str, float]]:
        return {name: source() for name, (source, _) in self._states.items()}

    # ---- a peer's side -------------------------------------------------------------------------------------
    def deliver(self, peer: str, name: str, items: list[Any]) -> None:
        channel = self._records.get(name)
        if channel is None:
            raise BusMessageError("unknown-channel", f"no channel {name!r}")
        channel[1](peer, items)

    def apply_states(self, peer: str, state: Mapping[str, Any], keep: Entries) -> None:
        """A peer's absolute plugin states (`keep` filters each state's entries)."""
        for name, (_, sink) in list(self._states.items()):
            sink(peer, {k: float(v) for k, v in keep(state.get(name, {}))})

    def expire(self, peer: str) -> None:
        """The peer's states are gone (it left, restarted or fell silent)."""
        for _, sink in self._states.values():
            sink(peer, None)
