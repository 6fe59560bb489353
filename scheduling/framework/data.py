"""Shared scheduling data: one producer per key, consumers that declare what they read.

Some data lives across decisions and is read by several plugins: the approximate prefix index is read by the
prefix scorer, the prefix-affinity filter, the no-hit-LRU scorer, the block-occupancy scorer, the estimated-latency
scorer and the P/D decider. If each plugin kept (or wrote) its own copy, two plugins configured with different
block sizes would silently read an index nobody writes. So, as in llm-d's data-producer model:

- data is named by a `DataKey` (what it is, plus the variant that makes it different data: a block size);
- a plugin lists what it reads in `Plugin.data_requests()`: a `DataRequest` with the key, the producer parameters
  the config set explicitly on that plugin, and `produces=True` when, as in GIE, the plugin's presence is what
  asks for the data to exist (prefix-cache-scorer produces prefix data; a filter only reads it);
- `wire_data` resolves, per loaded scheduler, every key to exactly ONE `Producer`: the one declared in the config's
  plugin list, or one created from the requests. It is the only writer. Every requester is bound to it.

Configuration errors, each naming both plugins involved:
- two requests (or a request and a declared producer) set the same defining parameter to different values;
- a key that is only read: some plugin requests it but nothing in the config produces it;
- two producers declared for one key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.framework.errors import ConfigError, join_path
from scheduling.framework.plugin import Plugin, Producer


@dataclass(frozen=True, slots=True)
class DataKey:
    """One piece of shared data: `name` says what it is, `variant` what makes two of them different."""

    name: str
    variant: Hashable = None

    def __str__(self) -> str:
        return self.name if self.variant is None else f"{self.name}[{self.variant}]"


@dataclass(frozen=True, slots=True)
class DataRequest:
    key: DataKey
    # Producer parameters this plugin's config set explicitly (name -> value): they must agree across plugins.
    params: Mapping[str, object] = field(default_factory=dict)
    # True when this plugin's presence makes the data exist (GIE: prefix-cache-scorer produces prefix data).
    produces: bool = False
    # What a reader should be told to add when nothing produces the key.
    hint: str = ""


# key name -> factory(key, merged explicit params, the requesting plugins) for producers created by the loader.
ProducerFactory = Callable[[DataKey, Mapping[str, object], list[Plugin[Any]]], Producer[Any]]


def _where(plugin: Plugin[Any], *, at: bool = True) -> str:
    """`plugin 'name' (type)`, with where it was declared when `at` (the error's own path names the first one)."""
    return f"plugin {plugin.describe()}" + (f" at {plugin.source}: {plugin.path}" if at and plugin.path else "")


Requests = dict[DataKey, list[tuple[Plugin[Any], DataRequest]]]  # per key, who requested it and how


def wire_data(
    plugins: Iterable[Plugin[Any]],
    factories: Mapping[str, ProducerFactory],
    *,
    source: str,
) -> dict[DataKey, Producer[Any]]:
    """Resolve every data request of `plugins` (declared producers included) to one producer and bind it.

    Returns the producers by key. Raises ConfigError for conflicts and for data nobody produces."""
    declared, requests = _collect(plugins, source)
    producers: dict[DataKey, Producer[Any]] = {}
    for key, reqs in requests.items():
        producer = declared.get(key)
        chosen = _agreed_params(key, producer, reqs, source)
        if producer is None:
            producer = _create_producer(key, chosen, requests, declared, factories, source)
        producers[key] = producer
        for plugin, _ in reqs:
            plugin.bind_data(key, producer)
    for key, producer in declared.items():
        producers.setdefault(key, producer)
    return producers


def _collect(plugins: Iterable[Plugin[Any]], source: str) -> tuple[dict[DataKey, Producer[Any]], Requests]:
    """The declared producers by key (one per key) and every plugin's requests by key, each plugin counted once."""
    declared: dict[DataKey, Producer[Any]] = {}
    requests: Requests = {}
    seen: set[int] = set()
    for plugin in plugins:
        if id(plugin) in seen:
            continue
        seen.add(id(plugin))
        if isinstance(plugin, Producer):
            key = plugin.data_key()
            other = declared.get(key)
            if other is not None:
                raise ConfigError(
                    plugin.source or source,
                    plugin.path,
                    f"{_where(plugin, at=False)} and {_where(other)} both produce {key}; declare one producer per key",
                )
            declared[key] = plugin
        for req in plugin.data_requests():
            requests.setdefault(req.key, []).append((plugin, req))
    return declared, requests


def _agreed_params(
    key: DataKey, producer: Producer[Any] | None, reqs: list[tuple[Plugin[Any], DataRequest]], source: str
) -> dict[str, tuple[object, Plugin[Any]]]:
    """The producer parameters set explicitly for `key` (by its declared producer and by the requests), each with
    the plugin that set it; two different values of one parameter are a ConfigError."""
    chosen: dict[str, tuple[object, Plugin[Any]]] = {}
    if producer is not None:
        p = producer.params
        for name in producer.defining_params:
            if name in producer.given_params:
                chosen[name] = (getattr(p, name), producer)
    for plugin, req in reqs:
        for name, value in req.params.items():
            have = chosen.get(name)
            if have is None:
                chosen[name] = (value, plugin)
            elif have[0] != value:
                raise ConfigError(
                    plugin.source or source,
                    join_path(plugin.path, name) if plugin.path else name,
                    f"{_where(plugin, at=False)} sets {name}={value!r} for {key}, but {_where(have[1])} sets "
                    f"{name}={have[0]!r}; plugins sharing {key} must agree",
                )
    return chosen


def _create_producer(
    key: DataKey,
    chosen: dict[str, tuple[object, Plugin[Any]]],
    requests: Requests,
    declared: Mapping[DataKey, Producer[Any]],
    factories: Mapping[str, ProducerFactory],
    source: str,
) -> Producer[Any]:
    """The producer of a key no plugin declares, from its factory with the agreed parameters, when some request
    produces it (a ConfigError naming the reader, and where the config produces another variant, when none does)."""
    reqs = requests[key]
    writers = [pl for pl, r in reqs if r.produces]
    if not writers:
        reader, req = reqs[0]
        others = [
            _where(pl) + f" ({k})" for k, rs in requests.items() if k != key and k.name == key.name
            for pl, r in rs if r.produces
        ]
        others += [_where(pr) + f" ({k})" for k, pr in declared.items() if k != key and k.name == key.name]
        there = f"; this config produces it only as {', '.join(others)}" if others else ""
        raise ConfigError(
            reader.source or source,
            reader.path,
            f"{_where(reader, at=False)} reads {key}, but no plugin in this config produces it{there}. "
            f"{req.hint}".rstrip(),
        )
    factory = factories.get(key.name)
    if factory is None:
        raise ConfigError(source, "", f"no producer is known for {key}")
    return factory(key, {k: v for k, (v, _) in chosen.items()}, [pl for pl, _ in reqs])
