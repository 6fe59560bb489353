"""`epp serve`'s request-path flags, parsed once: what the replies carry and how decisions are made and logged."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from epp.request.early import EarlySettings
from epp.request.early import add_flags as add_early_flags
from epp.request.outputs import OutputSettings
from epp.request.outputs import add_flags as add_output_flags
from epp.request.sessions import SessionSettings
from epp.request.sessions import add_flags as add_session_flags

# The conformance image (Dockerfile, target `conformance`) sets it: GIE's lwepp, which the suite runs with no config
# file, filters on test-epp-endpoint-selection and echoes the served endpoint natively (docs/deploy.md).
CONFORMANCE_ENV = "POINTSMAN_CONFORMANCE"


def add_flags(g: argparse._ActionsContainer) -> None:
    """The director's flags in the "protocol" group (the outputs have a group of their own: add_output_flags)."""
    g.add_argument("--fallbacks", type=int, default=0, help="extra endpoints in envoy.lb metadata (override_host)")
    g.add_argument("--enable-conformance-header", action="store_true",
                   default=os.environ.get(CONFORMANCE_ENV, "").lower() in ("1", "true", "yes"),
                   help="honour test-epp-endpoint-selection and echo x-conformance-test-served-endpoint "
                        f"(conformance tests only; also ${CONFORMANCE_ENV}=true, as the conformance image sets)")
    g.add_argument("--log-decisions", action="store_true", help="log one line per routing decision")


@dataclass(frozen=True)
class RequestSettings:
    """The director's settings (epp.request.director.DirectorConfig, with the default pool of the sources)."""

    outputs: OutputSettings = field(default_factory=OutputSettings)
    fallbacks: int = 0  # extra endpoints listed in envoy.lb metadata for override_host retries
    conformance: bool = False  # honour test-epp-endpoint-selection
    log_decisions: bool = False
    early: EarlySettings = field(default_factory=EarlySettings)  # deciding before the body ends (early.py)
    sessions: SessionSettings = field(default_factory=SessionSettings)  # agent session identity (sessions.py)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RequestSettings:
        outputs = OutputSettings.from_args(ns)
        if ns.fallbacks and not outputs.destination_metadata:
            raise ValueError("--fallbacks lists retry endpoints in envoy.lb metadata: it needs --destination-metadata")
        return cls(outputs=outputs, fallbacks=ns.fallbacks, conformance=ns.enable_conformance_header,
                   log_decisions=ns.log_decisions, early=EarlySettings.from_args(ns),
                   sessions=SessionSettings.from_args(ns))


__all__ = ["RequestSettings", "add_early_flags", "add_flags", "add_output_flags", "add_session_flags"]
