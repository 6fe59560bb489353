"""label-selector-filter: keep endpoints whose labels match a Kubernetes label selector.

keep(e) = ∀ (k, v) ∈ matchLabels: labels[k] == v
      and ∀ expr ∈ matchExpressions:
            In:           labels[k] ∈ values          (key present)
            NotIn:        k absent or labels[k] ∉ values
            Exists:       k present
            DoesNotExist: k absent
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, ConfigError, Filter, register
from scheduling.framework.errors import join_path
from scheduling.framework.plugin import State
from scheduling.types import Endpoint

_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Params:
    matchLabels: dict[str, str] = field(default_factory=dict)
    matchExpressions: list[Any] = field(default_factory=list)


def compile_expressions(raw: list[Any], source: str, path: str) -> list[tuple[str, str, frozenset[str]]]:
    out = []
    for i, expr in enumerate(raw):
        p = join_path(path, i)
        if not isinstance(expr, Mapping):
            raise ConfigError(source, p, f"expected a mapping with key, operator and values, got {expr!r}")
        unknown = set(expr) - {"key", "operator", "values"}
        if unknown:
            raise ConfigError(
                source, join_path(p, sorted(unknown)[0]), "unknown field; expected key, operator, values"
            )
        key = expr.get("key")
        if not isinstance(key, str) or not key:
            raise ConfigError(source, join_path(p, "key"), f"expected a non-empty string, got {key!r}")
        op = expr.get("operator")
        if op not in _OPS:
            raise ConfigError(
                source, join_path(p, "operator"), f"expected one of {', '.join(_OPS)}, got {op!r}"
            )
        values = expr.get("values", [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ConfigError(source, join_path(p, "values"), f"expected a list of strings, got {values!r}")
        if op in ("In", "NotIn") and not values:
            raise ConfigError(source, join_path(p, "values"), f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise ConfigError(source, join_path(p, "values"), f"operator {op} takes no values")
        out.append((key, op, frozenset(values)))
    return out


def matches(labels: Mapping[str, str], match_labels: Mapping[str, str], exprs: list[Any]) -> bool:
    for k, v in match_labels.items():
        if labels.get(k) != v:
            return False
    for key, op, values in exprs:
        present = key in labels
        if op == "In":
            if not present or labels[key] not in values:
                return False
        elif op == "NotIn":
            if present and labels[key] in values:
                return False
        elif op == "Exists":
            if not present:
                return False
        elif present:  # DoesNotExist
            return False
    return True


@register("label-selector-filter")
class LabelSelectorFilter(Filter[Params]):
    Params = Params

    def setup(self, build: BuildContext) -> None:
        self._exprs = compile_expressions(
            self.params.matchExpressions, build.source, join_path(build.path, "matchExpressions")
        )

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        ml = self.params.matchLabels
        ex = self._exprs
        return [e for e in candidates if matches(e.labels, ml, ex)]
