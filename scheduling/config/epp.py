"""Format A: EndpointPickerConfig (GIE `inference.networking.x-k8s.io/v1alpha1`, llm-d `llm-d.ai/v1alpha1`).

Defaulting (reference): no profiles -> one "default" profile referencing every filter, scorer and picker;
one profile and no handler -> single-profile-handler; a profile without a picker gets max-score-picker; a
missing weight is 1.
"""

from __future__ import annotations

import random
from typing import Any

from scheduling.api import ShellConfig
from scheduling.config.common import (
    Doc,
    assemble_profile,
    build_plugins,
    check_keys,
    expect_list,
    expect_mapping,
    expect_str,
    resolve_plugin_refs,
)
from scheduling.config.shell import SECTIONS as SHELL_SECTIONS
from scheduling.config.shell import build_shell_config
from scheduling.framework import (
    BuildContext,
    ConfigError,
    Filter,
    FilterScorer,
    Picker,
    Plugin,
    Profile,
    ProfileHandler,
    ProfileScheduler,
    Scorer,
    Timer,
    create,
)
from scheduling.framework.errors import join_path

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
KIND = "EndpointPickerConfig"
TOP_KEYS = ("apiVersion", "kind", "metadata", "plugins", "schedulingProfiles", *SHELL_SECTIONS)


def _or_empty(value: Any) -> Any:
    return [] if value is None else value


ProfileRefs = list[tuple[Plugin[Any], float | None, str]]  # a profile's plugins, each with its weight and config path


def build_epp_config(
    doc: Doc, *, rng: random.Random, timer: Timer | None, shared: dict[Any, Any]
) -> tuple[ProfileScheduler, ShellConfig]:
    """The scheduler of the document's profiles, and what its shell sections configure."""
    src = doc.source
    d = doc.data
    check_keys(d, TOP_KEYS, src, "")
    if d.get("apiVersion") not in API_VERSIONS:
        raise ConfigError(
            src, "apiVersion", f"expected one of {', '.join(API_VERSIONS)}, got {d.get('apiVersion')!r}"
        )
    meta = expect_mapping(d.get("metadata") or {}, src, "metadata")
    cfg_name = meta.get("name") or "default"
    expect_str(cfg_name, src, "metadata.name")

    built = build_plugins(expect_list(_or_empty(d.get("plugins")), src, "plugins"), source=src, base="plugins",
                          dialect="epp", shared=shared, params_key="parameters")
    order: list[Plugin[Any]] = [p for p, _ in built]
    plugins: dict[str, Plugin[Any]] = {p.name: p for p in order}

    handlers = [p for p in order if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        raise ConfigError(
            src,
            "plugins",
            f"at most one profile handler may be declared, got {', '.join(h.name for h in handlers)}",
        )

    profile_refs, ppaths = _profile_refs(d.get("schedulingProfiles"), order, plugins, src)
    profiles = {
        name: assemble_profile(name, refs, source=src, path=ppaths[name], shared=shared, dialect="epp")
        for name, refs in profile_refs.items()
    }
    handler = _profile_handler(handlers, order, profiles, src, shared)
    shell = build_shell_config(d, plugins, src)
    sched = ProfileScheduler(
        cfg_name, handler, profiles, rng=rng, timer=timer, declared=order
    )
    return sched, shell


def _profile_refs(
    raw_profiles: Any, order: list[Plugin[Any]], plugins: dict[str, Plugin[Any]], src: str
) -> tuple[dict[str, ProfileRefs], dict[str, str]]:
    """Each profile's plugin references and the config path it is declared at; without `schedulingProfiles`, one
    "default" profile of every filter, scorer and picker declared (at most one picker then)."""
    profile_refs: dict[str, ProfileRefs] = {}
    if not raw_profiles:
        pickers = [p for p in order if isinstance(p, Picker)]
        if len(pickers) > 1:
            raise ConfigError(
                src,
                "schedulingProfiles",
                "several pickers are declared but no profile says which to use; add schedulingProfiles",
            )
        profile_refs["default"] = [
            (p, None, join_path("plugins", i))
            for i, p in enumerate(order)
            if isinstance(p, (Filter, Scorer, Picker, FilterScorer))
        ]
        return profile_refs, {"default": "plugins"}
    ppaths: dict[str, str] = {}
    for j, rawp in enumerate(expect_list(raw_profiles, src, "schedulingProfiles")):
        ppath = join_path("schedulingProfiles", j)
        prof = expect_mapping(rawp, src, ppath, "a profile {name, plugins}")
        check_keys(prof, ("name", "plugins"), src, ppath)
        pname = expect_str(prof.get("name"), src, join_path(ppath, "name"), "a profile name")
        if pname in profile_refs:
            raise ConfigError(src, join_path(ppath, "name"), f"duplicate profile name {pname!r}")
        refs = resolve_plugin_refs(
            expect_list(_or_empty(prof.get("plugins")), src, join_path(ppath, "plugins")),
            plugins,
            source=src,
            base=join_path(ppath, "plugins"),
            name_key="pluginRef",
        )
        profile_refs[pname] = refs
        ppaths[pname] = ppath
    return profile_refs, ppaths


def _profile_handler(
    handlers: list[ProfileHandler[Any]], order: list[Plugin[Any]], profiles: dict[str, Profile], src: str,
    shared: dict[Any, Any]
) -> ProfileHandler[Any]:
    """The declared profile handler, or single-profile-handler when there is one profile; checked against the
    profiles."""
    handler: ProfileHandler[Any]
    if handlers:
        handler = handlers[0]
    elif len(profiles) == 1:
        made = create("single-profile-handler", build=BuildContext(src, "plugins", "epp", shared))
        assert isinstance(made, ProfileHandler)
        handler = made
    else:
        raise ConfigError(
            src,
            "plugins",
            f"{len(profiles)} profiles ({', '.join(profiles)}) need a profile handler plugin such as pd-profile-handler",
        )
    hidx = order.index(handler) if handler in order else None
    handler.validate_profiles(
        tuple(profiles),
        BuildContext(
            src, join_path("plugins", hidx) if hidx is not None else "schedulingProfiles", "epp", shared
        ),
    )
    return handler
