"""The request: one request's lifecycle (the director, the exchange and its stages, admitters, observers, parsing,
the mutations); docs/architecture.md walks one request through it. Its flags and settings are settings.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.request.admit import Admitter, SheddableAdmitter
    from epp.request.commit import mutations, mutations_for_provider, schedule
    from epp.request.director import DecisionIds, Director, DirectorConfig, ShellContext, error_outcome
    from epp.request.exchange import STAGE_NAMES, STAGES, RequestExchange
    from epp.request.holding import why as why_held
    from epp.request.observe import RequestObserver
    from epp.request.resolve import resolve
    from epp.request.sessions import SessionIdentity
    from epp.request.tracecontext import UNSAMPLED, TraceParent, find_parent, from_headers, from_metadata
    from epp.request.usage import Usage

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the CLI
# reads epp.request.settings without loading the request path.
_LAZY = {
    "Admitter": "admit", "SheddableAdmitter": "admit",
    "mutations": "commit", "mutations_for_provider": "commit", "schedule": "commit",
    "DecisionIds": "director", "Director": "director", "DirectorConfig": "director", "ShellContext": "director",
    "error_outcome": "director",
    "RequestExchange": "exchange", "STAGE_NAMES": "exchange", "STAGES": "exchange",
    "why_held": "holding:why",
    "RequestObserver": "observe",
    "resolve": "resolve",
    "SessionIdentity": "sessions",
    "TraceParent": "tracecontext", "from_headers": "tracecontext", "from_metadata": "tracecontext",
    "UNSAMPLED": "tracecontext", "find_parent": "tracecontext",
    "Usage": "usage",
}

__all__ = ["Admitter", "DecisionIds", "Director", "DirectorConfig", "RequestExchange", "RequestObserver", "STAGE_NAMES", "STAGES",
           "SessionIdentity", "SheddableAdmitter", "ShellContext", "TraceParent", "UNSAMPLED", "Usage", "error_outcome",
           "find_parent", "from_headers", "from_metadata", "mutations", "mutations_for_provider", "resolve", "schedule",
           "why_held"]


__getattr__ = lazy_exports(__name__, _LAZY)
