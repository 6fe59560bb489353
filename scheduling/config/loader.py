"""The one entry point: load every scheduling document and return a ModelScheduler."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from scheduling.api import ShellConfig
from scheduling.config.binding import parse_binding
from scheduling.config.builtin import builtin_scheduler
from scheduling.config.common import Doc
from scheduling.config.epp import KIND as EPP_KIND
from scheduling.config.epp import build_epp_config
from scheduling.config.heimdall import KIND as SP_KIND
from scheduling.config.heimdall import build_scheduling_profile
from scheduling.framework import ConfigError, ProfileScheduler, Timer
from scheduling.framework.data import ProducerFactory, wire_data
from scheduling.framework.model_scheduler import ModelScheduler
from scheduling.framework.plugin import SERVICES
from scheduling.plugins.producers.approx_prefix import create_approx_prefix
from scheduling.plugins.producers.precise_prefix import create_precise_prefix
from scheduling.plugins.producers.token_producer import create_token_producer
from scheduling.prefix.precise_data import PRECISE_PREFIX, TOKEN_IDS
from scheduling.prefix.shared import APPROX_PREFIX

# Producers the loader creates when plugins request data that no declared producer provides.
PRODUCER_FACTORIES: dict[str, ProducerFactory] = {
    APPROX_PREFIX: create_approx_prefix,
    PRECISE_PREFIX: create_precise_prefix,
    TOKEN_IDS: create_token_producer,
}

Source = Union[None, str, "os.PathLike[str]", Mapping[str, Any], Sequence[Mapping[str, Any]]]

KINDS = (EPP_KIND, SP_KIND, "ModelBinding", "AIGateway")


def read_documents(source: Source, *, name: str | None = None) -> list[Doc]:
    """YAML file (multi-document), one mapping, or a list of mappings -> [Doc]. Empty documents are skipped."""
    if source is None:
        return []
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = name or str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(label, "", f"cannot read the scheduling config: {err.strerror or err}") from err
        return parse_yaml(text, label)
    if isinstance(source, Mapping):
        return [Doc(source, name or "<config>")]
    if isinstance(source, Sequence):
        label = name or "<config>"
        docs = []
        for i, d in enumerate(source):
            if not isinstance(d, Mapping):
                raise ConfigError(
                    f"{label} (document {i + 1})", "", f"expected a mapping, got {type(d).__name__}"
                )
            docs.append(Doc(d, f"{label} (document {i + 1})" if len(source) > 1 else label))
        return docs
    raise TypeError(f"unsupported scheduling config source: {type(source).__name__}")


def parse_yaml(text: str, label: str) -> list[Doc]:
    try:
        raw = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(label, where, f"invalid YAML: {getattr(err, 'problem', None) or err}") from err
    docs = []
    for i, d in enumerate(raw):
        src = f"{label} (document {i + 1})" if len(raw) > 1 else label
        if not isinstance(d, Mapping):
            raise ConfigError(src, "", f"expected a mapping with apiVersion and kind, got {type(d).__name__}")
        docs.append(Doc(d, src))
    return docs


def load_scheduler(
    source: Source = None,
    *,
    rng: random.Random,
    timer: Timer | None = None,
    name: str | None = None,
    filter_served_models: bool = True,
    services: Mapping[str, Any] | None = None,
) -> ModelScheduler:
    """Build the scheduler from any mix of: at most one EndpointPickerConfig, SchedulingProfiles and at most one
    binding document (ModelBinding or AIGateway). `None` (or no documents) gives the built-in default.

    `rng` drives every random choice (ties, exploration, weighted picks); `timer` (e.g. time.perf_counter),
    when given, times every plugin into ProfileResult.details[].duration_s. `services` is what the shell lends the
    plugins (scheduling.framework.plugin.BuildContext.services), e.g. its precise prefix index ("precise-index").
    """
    docs = read_documents(source, name=name)
    shared: dict[Any, Any] = {SERVICES: dict(services or {})}
    loaded = _build_documents(docs, rng=rng, timer=timer, shared=shared)
    epp, profiles, bindings = loaded.epp, loaded.profiles, loaded.bindings
    if epp is not None:
        fallback = epp
    elif bindings is None and len(profiles) == 1:
        # One SchedulingProfile and nothing binding it: it is what the user meant to run.
        fallback = next(iter(profiles.values()))
    else:
        fallback = builtin_scheduler(rng=rng, timer=timer, shared=shared)
    named = dict(profiles)
    if epp is not None and epp.name not in named:
        named[epp.name] = epp
    resolved = _resolve_bindings(bindings or [], named, loaded.binding_src)
    schedulers = [*named.values(), fallback]
    wire_data(
        [p for sched in schedulers for p in sched.plugins()],
        PRODUCER_FACTORIES,
        source=name or (docs[0].source if docs else "<builtin default>"),
    )
    for sched in schedulers:
        sched.finalize()
    return ModelScheduler(named, resolved, fallback, filter_served_models=filter_served_models, shell=loaded.shell)


@dataclass
class _Loaded:
    """What the documents declare, by kind."""

    epp: ProfileScheduler | None = None  # the EndpointPickerConfig's scheduler
    shell: ShellConfig = field(default_factory=ShellConfig)  # its shell sections
    profiles: dict[str, ProfileScheduler] = field(default_factory=dict)  # the SchedulingProfiles by name
    bindings: list[tuple[str, str, str]] | None = None  # the binding document's (model, profile, path)
    binding_src: str = ""


def _build_documents(
    docs: list[Doc], *, rng: random.Random, timer: Timer | None, shared: dict[Any, Any]
) -> _Loaded:
    """Build each document by its kind: at most one EndpointPickerConfig, SchedulingProfiles of distinct names, at
    most one binding document."""
    out = _Loaded()
    profile_src: dict[str, str] = {}
    for doc in docs:
        kind = doc.data.get("kind")
        if kind == EPP_KIND:
            if out.epp is not None:
                raise ConfigError(doc.source, "kind", "only one EndpointPickerConfig may be loaded")
            out.epp, out.shell = build_epp_config(doc, rng=rng, timer=timer, shared=shared)
        elif kind == SP_KIND:
            sched = build_scheduling_profile(doc, rng=rng, timer=timer, shared=shared)
            if sched.name in out.profiles:
                raise ConfigError(
                    doc.source,
                    "metadata.name",
                    f"SchedulingProfile {sched.name!r} is already defined in {profile_src[sched.name]}",
                )
            out.profiles[sched.name] = sched
            profile_src[sched.name] = doc.source
        elif kind in ("ModelBinding", "AIGateway"):
            if out.bindings is not None:
                raise ConfigError(
                    doc.source, "kind", f"only one binding document may be loaded (first: {out.binding_src})"
                )
            out.bindings = parse_binding(doc)
            out.binding_src = doc.source
        else:
            raise ConfigError(doc.source, "kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    return out


def _resolve_bindings(
    bindings: list[tuple[str, str, str]], named: Mapping[str, ProfileScheduler], binding_src: str
) -> list[tuple[str, str]]:
    """The binding document's (model, profile) pairs, each profile one that was loaded."""
    resolved: list[tuple[str, str]] = []
    for model, profile, path in bindings:
        if profile not in named:
            raise ConfigError(
                binding_src,
                f"{path}.profile",
                f"no SchedulingProfile named {profile!r} was loaded; loaded: {', '.join(named) or '(none)'}",
            )
        resolved.append((model, profile))
    return resolved
