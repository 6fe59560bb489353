"""Format B: Heimdall SchedulingProfile (`heimdall.moreh.io/v1alpha1`, cluster-scoped).

spec.profileHandler: e2e (one profile, "default") or pd ("prefill" and "decode" profiles; the role filters are
internal and prepended here). spec.plugins: [{type, name?, config?}]. spec.profiles.<name>.pluginRefs:
[{name, weight?}] in evaluation order; a missing weight is 1; a profile without a picker gets max-score-picker.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

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
from scheduling.framework import (
    BuildContext,
    ConfigError,
    Filter,
    Plugin,
    Profile,
    ProfileScheduler,
    Timer,
    create_filter,
    create_handler,
)
from scheduling.framework.errors import join_path

API_VERSION = "heimdall.moreh.io/v1alpha1"
KIND = "SchedulingProfile"
HANDLERS = ("e2e", "pd")


def build_scheduling_profile(
    doc: Doc, *, rng: random.Random, timer: Timer | None, shared: dict[Any, Any]
) -> ProfileScheduler:
    """The scheduler of one SchedulingProfile document."""
    src = doc.source
    d = doc.data
    check_keys(d, ("apiVersion", "kind", "metadata", "spec", "status"), src, "")
    if d.get("apiVersion") != API_VERSION:
        raise ConfigError(src, "apiVersion", f"expected {API_VERSION}, got {d.get('apiVersion')!r}")
    meta = expect_mapping(d.get("metadata"), src, "metadata", "a mapping with name")
    name = expect_str(meta.get("name"), src, "metadata.name", "the SchedulingProfile name")
    spec = expect_mapping(d.get("spec"), src, "spec", "a mapping with profileHandler, plugins and profiles")
    check_keys(spec, ("profileHandler", "plugins", "profiles"), src, "spec")
    mode = spec.get("profileHandler")
    if mode not in HANDLERS:
        raise ConfigError(src, "spec.profileHandler", f"expected one of {', '.join(HANDLERS)}, got {mode!r}")

    built = _build_plugins(spec, src, shared)
    plugins: dict[str, tuple[Plugin[Any], str]] = {plugin.name: (plugin, path) for plugin, path in built}
    declared = {name: plugin for name, (plugin, _) in plugins.items()}
    profiles = _build_profiles(spec, mode, declared, src, shared)
    hbuild = BuildContext(src, "spec.profileHandler", "heimdall", shared)
    if mode == "e2e":
        handler = create_handler("single-profile-handler", build=hbuild)
    else:
        handler = create_handler("pd-profile-handler", params={"decider": "always"}, build=hbuild)
    return ProfileScheduler(name, handler, profiles, rng=rng, timer=timer, declared=[p for p, _ in built])


def _build_plugins(spec: Mapping[str, Any], src: str, shared: dict[Any, Any]) -> list[tuple[Plugin[Any], str]]:
    """spec.plugins built, each with its config path; no profile handler among them (spec.profileHandler chooses
    it)."""
    entries = expect_list(spec.get("plugins"), src, "spec.plugins", "a list of plugins")
    built = build_plugins(entries, source=src, base="spec.plugins", dialect="heimdall", shared=shared,
                          params_key="config")
    for plugin, path in built:
        if plugin.kind == "handler":
            raise ConfigError(
                src,
                join_path(path, "type"),
                "profile handlers are chosen by spec.profileHandler, not declared as plugins",
            )
    return built


def _build_profiles(
    spec: Mapping[str, Any], mode: str, declared: dict[str, Plugin[Any]], src: str, shared: dict[Any, Any]
) -> dict[str, Profile]:
    """spec.profiles, exactly the ones the handler expects (e2e: default; pd: prefill and decode, each behind its
    internal role filter)."""
    raw_profiles = expect_mapping(
        spec.get("profiles"), src, "spec.profiles", "a mapping of profile name to pluginRefs"
    )
    expected = ("default",) if mode == "e2e" else ("prefill", "decode")
    for pname in raw_profiles:
        if pname not in expected:
            raise ConfigError(
                src,
                join_path("spec.profiles", str(pname)),
                f"profileHandler {mode} expects profiles {', '.join(expected)}, got {pname!r}",
            )
    for want in expected:
        if want not in raw_profiles:
            raise ConfigError(src, "spec.profiles", f"profileHandler {mode} needs a profile named {want!r}")

    profiles = {}
    for pname in expected:
        ppath = join_path("spec.profiles", pname)
        prof = expect_mapping(raw_profiles[pname], src, ppath, "a mapping with pluginRefs")
        check_keys(prof, ("pluginRefs",), src, ppath)
        refs = resolve_plugin_refs(
            expect_list(prof.get("pluginRefs"), src, join_path(ppath, "pluginRefs")),
            declared,
            source=src,
            base=join_path(ppath, "pluginRefs"),
            name_key="name",
        )
        build = BuildContext(src, ppath, "heimdall", shared)
        internal: list[Filter[Any]] = []
        if mode == "pd":
            internal = [create_filter(f"{pname}-filter", f"{pname}-filter (internal)", build=build)]
        profiles[pname] = assemble_profile(
            pname,
            refs,
            source=src,
            path=ppath,
            shared=shared,
            dialect="heimdall",
            prepend_filters=internal,
        )
    return profiles
