"""Router variants declared on the command line: a Pointsman router with extra `epp serve` flags.

    --router-variant 'NAME:FLAGS'          Pointsman's default plus FLAGS
    --router-variant 'NAME@BASE:FLAGS'     BASE (pointsman, pointsman-best, pointsman-approx, pointsman-precise,
                                           pointsman-gie) plus FLAGS

FLAGS go on the `epp serve` command line after the base's own flags (a shell parses them: quote as in a shell).
Placeholders: `{fleet_profile}` is deploy/profiles/estimated-latency.yaml with the fleet's engine timings (written
to the variant's work directory), `{workdir}` that directory, `{time_scale}` the fleet's time scale. Leading
`NAME=VALUE` words are the epp process's environment instead of flags: `PYTHONPATH=/path/to/other/checkout` runs
another tree's Pointsman (its `epp serve`, with this tree's benchmark), for before/after comparisons in one run.
Examples:

    --router-variant 'pointsman-seed1:--seed 1'
    --router-variant 'pointsman-fleet:--config-file {fleet_profile}'      # = pointsman-best
    --router-variant 'precise-cfg@pointsman-precise:--config-file /path/to/profile.yaml'
    --router-variant 'before:PYTHONPATH=/path/to/main/checkout'          # the default as another tree has it
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bench.routing.routers import (
    POINTSMAN_BASES,
    Adapter,
    FleetInfo,
    Launched,
    pointsman_base_args,
    start_pointsman,
    write_best_profile,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Variant:
    name: str
    base: str
    flags: str

    def render(self, fleet: FleetInfo, workdir: Path) -> str:
        flags = self.flags
        if "{fleet_profile}" in flags:
            profile = write_best_profile(fleet, workdir / f"{self.name}-fleet-profile.yaml")
            flags = flags.replace("{fleet_profile}", str(profile))
        return flags.replace("{workdir}", str(workdir)).replace("{time_scale}", f"{fleet.time_scale:g}")


def parse_variant(text: str, taken: set[str] | frozenset[str] = frozenset()) -> Variant:
    """'NAME[@BASE]:FLAGS' -> Variant; a clear ValueError for a bad or clashing name or an unknown base."""
    head, sep, flags = text.partition(":")
    if not sep:
        raise ValueError(f"router variant {text!r}: expected NAME[@BASE]:FLAGS")
    name, _, base = head.strip().partition("@")
    base = base or "pointsman"
    if not _NAME.match(name):
        raise ValueError(f"router variant {text!r}: the name must be letters, digits, '.', '_' or '-'")
    if name in taken:
        raise ValueError(f"router variant {name!r}: the name is already a router")
    if base not in POINTSMAN_BASES:
        raise ValueError(f"router variant {name!r}: unknown base {base!r}; choose from {', '.join(POINTSMAN_BASES)}")
    return Variant(name, base, flags.strip())


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")


def split_env(flags: str) -> tuple[dict[str, str], str]:
    """Leading NAME=VALUE words of `flags` (the epp process's environment) and the rest (epp serve flags)."""
    env: dict[str, str] = {}
    words = flags.split()
    while words and _ASSIGN.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, " ".join(words) if env else flags


def variant_adapter(v: Variant) -> Adapter:
    async def start(fleet: FleetInfo, workdir: Path) -> Launched:
        extra, kv_events = pointsman_base_args(v.base, fleet, workdir, tag=v.name)
        env, flags = split_env(v.render(fleet, workdir))
        return await start_pointsman(fleet, workdir, extra=f"{extra} {flags}", kv_events=kv_events, env=env or None)

    return start
