"""What Pointsman's routing replies carry: `--data-plane` profiles and per-output flags.

Every output costs twice, in Pointsman (building and serializing it) and in the proxy (decoding and applying it:
a header mutation, a dynamic-metadata Struct, a route recomputation). A data plane reads only some of them:

| output                                                  | full (default) | original-dst | override-host |
|---------------------------------------------------------|----------------|--------------|---------------|
| `x-gateway-destination-endpoint` header                 | set            | set          | removed if the client sent it |
| `envoy.lb` dynamic metadata                             | set            | -            | set           |
| `X-Gateway-Model-Name`, `X-Gateway-Base-Model-Name`, `x-ai-eg-model` | set | -        | -             |
| `clear_route_cache`                                     | on             | off          | off           |
| removal of client-sent `-served`, `-subset`, `x-prefiller-host-port` | always | if sent | if sent       |

- `full` is what every gateway integration expects (GIE's header + metadata contract; Envoy AI Gateway routes on
  `x-ai-eg-model` after `clear_route_cache`; routes may match the model headers). It is the default, and what a
  deployment saw before these flags existed.
- `original-dst` fits `epp envoy-config --variant original-dst`: the ORIGINAL_DST cluster reads the header when it
  picks the host, on the one catch-all route, so nothing else is read.
- `override-host` fits `--variant override-host` (static or `--eds`): the override_host policy reads `envoy.lb`.
  A mismatched profile is not detected by Pointsman: override_host without metadata silently falls back to round
  robin, ORIGINAL_DST without the header fails the request (503). docs/envoy.md names the profile of each variant.

Per-output flags (`--destination-header`, `--destination-metadata`, `--clear-route-cache`, `--model-header`,
`--base-model-header`, `--ai-gateway-model-header`) override the profile; a model header flag set to '' disables
that header. `x-request-id` is set only when the request has none: Envoy always sends one, so it costs nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from epp.argtypes import parse_bool

DATA_PLANES: dict[str, dict[str, bool]] = {
    "full": {"destination_header": True, "destination_metadata": True, "clear_route_cache": True,
             "model_headers": True, "remove_absent": True},
    "original-dst": {"destination_header": True, "destination_metadata": False, "clear_route_cache": False,
                     "model_headers": False, "remove_absent": False},
    "override-host": {"destination_header": False, "destination_metadata": True, "clear_route_cache": False,
                      "model_headers": False, "remove_absent": False},
}
MODEL_HEADERS = {"model_header": "X-Gateway-Model-Name", "base_model_header": "X-Gateway-Base-Model-Name",
                 "ai_gateway_model_header": "x-ai-eg-model"}


def add_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument("--data-plane", choices=tuple(DATA_PLANES), default="full",
                   help="which routing outputs to send: full (default: header, envoy.lb metadata, model headers, "
                        "clear_route_cache), or only what that generated Envoy variant reads (epp/request/outputs.py)")
    g.add_argument("--destination-header", type=parse_bool, default=None,
                   help="set x-gateway-destination-endpoint (default: by --data-plane)")
    g.add_argument("--destination-metadata", type=parse_bool, default=None,
                   help="set envoy.lb dynamic metadata (default: by --data-plane)")
    g.add_argument("--clear-route-cache", type=parse_bool, default=None,
                   help="ask Envoy to recompute the route after the mutations (default: by --data-plane)")
    g.add_argument("--model-header", default=None, help="X-Gateway-Model-Name unless --data-plane drops it; '' disables")
    g.add_argument("--base-model-header", default=None,
                   help="X-Gateway-Base-Model-Name unless --data-plane drops it; '' disables")
    g.add_argument("--ai-gateway-model-header", default=None,
                   help="x-ai-eg-model unless --data-plane drops it; '' disables")


@dataclass(frozen=True)
class OutputSettings:
    """What the replies carry: the DirectorConfig fields of `--data-plane` and the per-output flags."""

    destination_header: bool = True
    destination_metadata: bool = True
    clear_route_cache: bool = True
    remove_absent: bool = True
    model_header: str | None = MODEL_HEADERS["model_header"]  # None: not set
    base_model_header: str | None = MODEL_HEADERS["base_model_header"]
    ai_gateway_model_header: str | None = MODEL_HEADERS["ai_gateway_model_header"]

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> OutputSettings:
        """The profile with the per-output flags over it; ValueError for a combination that cannot route."""
        profile = DATA_PLANES[ns.data_plane or "full"]
        out: dict[str, Any] = {"remove_absent": profile["remove_absent"]}
        for key in ("destination_header", "destination_metadata", "clear_route_cache"):
            value = getattr(ns, key)
            out[key] = profile[key] if value is None else value
        for key, default in MODEL_HEADERS.items():
            value = getattr(ns, key)
            out[key] = (value if value is not None else default if profile["model_headers"] else "") or None
        if not (out["destination_header"] or out["destination_metadata"]):
            raise ValueError("--destination-header and --destination-metadata are both off: nothing would route")
        return cls(**out)

    def fields(self) -> dict[str, Any]:
        """As DirectorConfig keyword arguments."""
        return dataclasses.asdict(self)
