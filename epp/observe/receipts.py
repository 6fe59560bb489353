"""Decision receipts: every decision and rejection gets an id, and the decision can be looked up by it afterwards.

The id (`<process prefix>-<n in hex>`, epp/request/director.py `DecisionIds`) is taken when a request is committed
or rejected. It travels:
- in a response header, with `--decision-header NAME` (e.g. x-pointsman-decision): on the upstream response (the
  response-headers phase must reach Pointsman: not with `epp envoy-config --response-phases lean`) and on a
  rejection's local reply;
- in Envoy's dynamic metadata, namespace `pointsman`, key `decision_id` (`--decision-metadata`, on by default), so
  the access log can print it: `%DYNAMIC_METADATA(pointsman:decision_id)%` (the ext_proc filter must accept the
  namespace: `epp envoy-config` lists it in `receiving_namespaces`);
- in decision log lines and request errors (`--log-decisions`, `--log-format json`), and on the request's span.

The decision as it was made (the candidates, each profile run's per-plugin scores and totals, the pick, the
runner-up and the margin) and how it went (status, TTFT, duration, usage; a rejection's error code) stay in the
decision recorder (epp/api/dashboard/recorder.py: references to what the scheduler computed anyway, no copies) for
`--receipts` decisions (by default the dashboard's own ring: receipts add nothing to what the dashboard costs) and
at most `--receipt-max-age`. `epp explain --decision ID`, the gRPC API (`GetReceipt`) and
the dashboard show it (the lookup and the Receipt message: epp/api/receipts.py). Ids are per process: with `epp serve --workers N` a receipt is found only by the worker that
made it (the API answers another worker's id with "not found here").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_AGE = 900.0


@dataclass(frozen=True)
class ReceiptSettings:
    count: int | None = None  # decisions kept; None: as many as the dashboard keeps (none without it); 0: none
    max_age: float = DEFAULT_MAX_AGE  # seconds; 0: no age limit
    header: str = ""  # response header carrying the id ("" none)
    metadata: bool = True  # the id in the `pointsman` dynamic-metadata namespace

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ReceiptSettings:
        count = getattr(ns, "receipts", None)
        age = getattr(ns, "receipt_max_age", DEFAULT_MAX_AGE)
        if (count is not None and count < 0) or age < 0:
            raise ValueError("--receipts and --receipt-max-age must be 0 or more")
        header = (getattr(ns, "decision_header", "") or "").strip().lower()
        if header and (header.startswith(":") or not header.replace("-", "").isalnum()):
            raise ValueError(f"--decision-header {header!r} is not a header name")
        return cls(count=count, max_age=age, header=header,
                   metadata=bool(getattr(ns, "decision_metadata", True)))


def add_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool],
              parse_duration: Callable[[str], float]) -> None:
    g = p.add_argument_group("decision receipts (docs/observability.md)")
    g.add_argument("--receipts", type=int, default=None,
                   help="decisions kept for `epp explain --decision ID` and the dashboard (default: the dashboard's "
                        "--dashboard-decisions while the dashboard is on, else none); 0 keeps none")
    g.add_argument("--receipt-max-age", type=parse_duration, default=DEFAULT_MAX_AGE,
                   help="how long a decision is kept at most (15m); 0: only --receipts limits them")
    g.add_argument("--decision-header", default="",
                   help="return the decision id in this response header, e.g. x-pointsman-decision (default: none)")
    g.add_argument("--decision-metadata", type=parse_bool, default=True,
                   help="put the decision id in Envoy's dynamic metadata, namespace pointsman, key decision_id, "
                        "for the access log (default true)")
