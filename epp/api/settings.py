"""The API's flags, parsed once: `epp serve`'s dashboard (docs/dashboard.md), who may read /metrics
(`--metrics-endpoint-auth`), and the clients `epp explain` and `epp endpoints`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from epp.argtypes import parse_bool


def add_dashboard_flags(g: argparse._ActionsContainer) -> None:
    """The "dashboard" group."""
    g.add_argument("--dashboard", type=parse_bool, default=True,
                   help="serve the dashboard and record decisions for it (true); false turns both off")
    g.add_argument("--dashboard-path-prefix", default="/", help="URL path of the page on the metrics port (/)")
    g.add_argument("--dashboard-token", default=os.environ.get("POINTSMAN_DASHBOARD_TOKEN") or None,
                   help="require this bearer token for the page and its APIs (/metrics stays open); "
                        "prefer the POINTSMAN_DASHBOARD_TOKEN environment variable, flags show in ps")
    g.add_argument("--dashboard-decisions", type=int, default=500,
                   help="recent decisions kept for the page, with their per-plugin scores (500)")


@dataclass(frozen=True)
class DashboardSettings:
    enabled: bool = True  # the page, and the decision recorder it reads
    path_prefix: str = "/"
    token: str | None = field(default=None, repr=False)  # a secret: never in a repr, a log or a metric
    decisions: int = 500  # recent decisions kept

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> DashboardSettings:
        return cls(enabled=ns.dashboard, path_prefix=ns.dashboard_path_prefix, token=ns.dashboard_token,
                   decisions=ns.dashboard_decisions)




def add_metrics_auth_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument("--metrics-endpoint-auth", type=parse_bool, default=None,
                   help="GET /metrics needs a bearer token that Kubernetes authenticates (TokenReview) and allows to "
                        "get the non-resource URL /metrics (SubjectAccessReview), as GIE's EPP. Default: true when "
                        "Pointsman reads Kubernetes (an InferencePool, a selector, route documents), false otherwise")


@dataclass(frozen=True)
class MetricsAuthSettings:
    """`--metrics-endpoint-auth` resolved: GIE's default (on) where there is a Kubernetes API to ask, off standalone
    (an endpoints file: nothing could check a token)."""

    enabled: bool = False
    explicit: bool = False  # the flag was given (not the default)

    @classmethod
    def from_args(cls, ns: argparse.Namespace, kubernetes: bool) -> MetricsAuthSettings:
        given = ns.metrics_endpoint_auth
        return cls(enabled=kubernetes if given is None else bool(given), explicit=given is not None)


def add_explain_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--addr", default="127.0.0.1:9002")
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("-H", "--header", action="append", default=[], help="name: value")
    p.add_argument("--body", default=None, help="request body (JSON); '@file' reads a file; default: stdin")
    p.add_argument("--pool", default="")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--decision", default=None, metavar="ID",
                   help="show a past decision by its id, as it was made (decision receipts)")


def add_endpoints_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--addr", default="127.0.0.1:9002")
    p.add_argument("--pool", default="")
    p.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class ExplainSettings:
    """`epp explain`: which endpoint a running Pointsman would pick for a request, and why."""

    addr: str = "127.0.0.1:9002"
    path: str = "/v1/chat/completions"
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: str | None = None  # the JSON itself, '@file', or None: stdin
    pool: str = ""
    json: bool = False
    decision: str | None = None  # a past decision's id: show its receipt instead

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ExplainSettings:
        headers = {}
        for h in ns.header:
            name, sep, value = h.partition(":")
            if not sep:
                raise ValueError(f"header {h!r} is not 'name: value'")
            headers[name.strip().lower()] = value.strip()
        return cls(addr=ns.addr, path=ns.path, headers=headers, body=ns.body, pool=ns.pool, json=ns.json,
                   decision=ns.decision)


@dataclass(frozen=True)
class EndpointsSettings:
    """`epp endpoints`: what a running Pointsman's picker sees."""

    addr: str = "127.0.0.1:9002"
    pool: str = ""
    json: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> EndpointsSettings:
        return cls(addr=ns.addr, pool=ns.pool, json=ns.json)


__all__ = ["DashboardSettings", "EndpointsSettings", "ExplainSettings", "MetricsAuthSettings", "add_dashboard_flags",
           "add_endpoints_flags", "add_explain_flags", "add_metrics_auth_flags"]
