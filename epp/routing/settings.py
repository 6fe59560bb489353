"""`epp serve`'s route-document flags, parsed once (cheap to import: the CLI builds every command's flags)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "routes" group."""
    g.add_argument("--routes-file", action="append", default=[],
                   help="route documents, multi-document YAML, hot-reloaded (repeatable)")
    g.add_argument("--watch-routes", action="store_true",
                   default=os.environ.get("POINTSMAN_WATCH_ROUTES", "").lower() in ("1", "true", "yes"),
                   help="watch route documents in --pool-namespace (Kubernetes; default: $POINTSMAN_WATCH_ROUTES)")
    g.add_argument("--provider-secrets-dir", default=None,
                   help="standalone provider credentials: <dir>/<secret name>/<key> (the layout of a Secret volume)")
    g.add_argument("--provider-header", default="x-pointsman-provider",
                   help="the request header Envoy's provider routes match (Pointsman always sets or removes it)")


@dataclass(frozen=True)
class RouteSettings:
    """Route documents: Kthena's ModelRoute, ModelServer and ExternalModelProvider, LLMKube's ModelRouter."""

    files: tuple[str, ...] = ()  # --routes-file, hot-reloaded
    watch: bool = False  # --watch-routes: the documents of --pool-namespace in Kubernetes
    provider_secrets_dir: str | None = None
    provider_header: str = "x-pointsman-provider"

    @property
    def enabled(self) -> bool:
        return bool(self.files or self.watch)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RouteSettings:
        return cls(files=tuple(ns.routes_file), watch=ns.watch_routes, provider_secrets_dir=ns.provider_secrets_dir,
                   provider_header=ns.provider_header)


__all__ = ["RouteSettings", "add_flags"]
