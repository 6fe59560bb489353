"""by-label-filter (legacy GIE `by-label`): keep endpoints whose `label` value is one of `validValues`.

keep(e) = label ∈ labels(e) ? labels(e)[label] ∈ validValues : allowsNoLabel
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, ConfigError, Filter, register
from scheduling.framework.errors import join_path
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    label: str = ""
    validValues: list[str] = field(default_factory=list)
    allowsNoLabel: bool = False


@register("by-label-filter")
class ByLabelFilter(Filter[Params]):
    Params = Params

    def setup(self, build: BuildContext) -> None:
        if not self.params.label:
            raise ConfigError(build.source, join_path(build.path, "label"), "expected a non-empty label name")
        self._valid = frozenset(self.params.validValues)

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        label = self.params.label
        valid = self._valid
        no_label = self.params.allowsNoLabel
        out = []
        for e in candidates:
            v = e.labels.get(label)
            if (v in valid) if v is not None else no_label:
                out.append(e)
        return out
