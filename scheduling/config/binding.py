"""Model -> SchedulingProfile bindings.

Accepted documents:
- `kind: ModelBinding` (apiVersion pointsman.io/v1alpha1) with `spec.schedulingProfiles: [{model, profile}]`;
- a Heimdall `kind: AIGateway` (heimdall.moreh.io/v1alpha1): only `spec.schedulingProfiles` is read.
Entries keep list order (the first entry for a model wins); the model `default` is the lowest-priority
fallback wherever it appears.
"""

from __future__ import annotations

from scheduling.config.common import Doc, check_keys, expect_list, expect_mapping, expect_str
from scheduling.framework import ConfigError
from scheduling.framework.errors import join_path

BINDING_API = "pointsman.io/v1alpha1"
GATEWAY_API = "heimdall.moreh.io/v1alpha1"


def parse_binding(doc: Doc) -> list[tuple[str, str, str]]:
    """[(model, profile, field path)] in list order."""
    src = doc.source
    d = doc.data
    kind = d.get("kind")
    if kind == "ModelBinding":
        check_keys(d, ("apiVersion", "kind", "metadata", "spec"), src, "")
        if d.get("apiVersion") != BINDING_API:
            raise ConfigError(src, "apiVersion", f"expected {BINDING_API}, got {d.get('apiVersion')!r}")
        spec = expect_mapping(d.get("spec"), src, "spec", "a mapping with schedulingProfiles")
        check_keys(spec, ("schedulingProfiles",), src, "spec")
    else:  # AIGateway: a deployment resource; everything but spec.schedulingProfiles belongs to the operator
        if d.get("apiVersion") != GATEWAY_API:
            raise ConfigError(src, "apiVersion", f"expected {GATEWAY_API}, got {d.get('apiVersion')!r}")
        spec = expect_mapping(d.get("spec"), src, "spec", "a mapping with schedulingProfiles")
    out = []
    entries = expect_list(spec.get("schedulingProfiles", []), src, "spec.schedulingProfiles")
    for i, raw in enumerate(entries):
        path = join_path("spec.schedulingProfiles", i)
        entry = expect_mapping(raw, src, path, "a binding {model, profile}")
        check_keys(entry, ("model", "profile"), src, path)
        model = expect_str(entry.get("model"), src, join_path(path, "model"), "a model name (or 'default')")
        profile = expect_str(
            entry.get("profile"), src, join_path(path, "profile"), "a SchedulingProfile name"
        )
        out.append((model, profile, path))
    return out
