"""`epp serve`'s request-path flags, parsed once: what the replies carry, how decisions are made and logged, early
decisions (early.py) and agent sessions (sessions.py). Only flags and frozen settings: the request path imports
these, never the reverse (the CLI builds the flags without loading the request path)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from epp.request.outputs import OutputSettings
from epp.request.outputs import add_flags as add_output_flags
from scheduling.sessions.identity import BODY_FIELDS, IdentitySources

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


@dataclass(frozen=True, slots=True)
class EarlySettings:
    """`--early-decisions` and `--trusted-model-header` (see the module docstring)."""

    decisions: bool = True
    model_headers: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> EarlySettings:
        return cls(decisions=getattr(ns, "early_decisions", True),
                   model_headers=tuple(h.lower() for h in getattr(ns, "trusted_model_header", None) or ()))


def add_early_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool]) -> None:
    g = p.add_argument_group("early decisions (docs/protocol.md)")
    g.add_argument("--early-decisions", type=parse_bool, default=True,
                   help="decide on the prompt's head: in FULL_DUPLEX_STREAMED before the body ends once the model, "
                        "the hashed head and (with agent sessions) the session have arrived; at its end, the rest "
                        "unread, when one of them comes after the prompt (true)")
    g.add_argument("--trusted-model-header", action="append", default=[],
                   help="a request header that names the model, set by a filter before Pointsman (e.g. "
                        "X-Gateway-Model-Name from a body-based router); repeatable; none by default, since a "
                        "client can send any header")


FAIRNESS_KEYS = ("tenant", "session", "program")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class SessionSettings:
    enabled: bool = True
    headers: tuple[str, ...] = ("x-session-id",)
    body_fields: tuple[str, ...] = BODY_FIELDS
    previous_response_id: bool = True
    program_header: str = ""
    max_bytes: int = 256
    fairness: str = "tenant"  # what flow control's fairness is keyed by: tenant | session | program

    def __post_init__(self) -> None:
        if self.fairness not in FAIRNESS_KEYS:
            raise ValueError(f"--flow-fairness-key must be one of {', '.join(FAIRNESS_KEYS)}, got {self.fairness!r}")
        bad = [f for f in self.body_fields if f not in BODY_FIELDS]
        if bad:
            raise ValueError(f"--session-body-fields: unknown field(s) {', '.join(bad)}; choose from "
                             f"{', '.join(BODY_FIELDS)}")
        if not 1 <= self.max_bytes <= 4096:
            raise ValueError(f"--session-max-bytes must be in [1, 4096], got {self.max_bytes}")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SessionSettings:
        d = cls()
        return cls(
            enabled=getattr(ns, "sessions", d.enabled),
            headers=tuple(h.lower() for h in _names(getattr(ns, "session_headers", None) or ",".join(d.headers))),
            body_fields=_names(ns.session_body_fields) if getattr(ns, "session_body_fields", None) is not None
            else d.body_fields,
            previous_response_id=getattr(ns, "session_previous_response_id", d.previous_response_id),
            program_header=(getattr(ns, "program_header", None) or "").lower(),
            max_bytes=getattr(ns, "session_max_bytes", d.max_bytes),
            fairness=getattr(ns, "flow_fairness_key", d.fairness),
        )

    def sources(self) -> IdentitySources:
        return IdentitySources(headers=self.headers, body=self.body_fields,
                               previous_response_id=self.previous_response_id,
                               responses_chain=self.previous_response_id, program_header=self.program_header,
                               max_bytes=self.max_bytes)


def add_session_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool]) -> None:
    g = p.add_argument_group("agent sessions (docs/sessions.md)")
    g.add_argument("--sessions", type=parse_bool, default=True,
                   help="identify agent sessions and keep their turns where their context is (true); false: every "
                        "request is placed on its own")
    g.add_argument("--session-headers", default=None,
                   help="request headers naming the session, in order (comma list; default x-session-id)")
    g.add_argument("--session-body-fields", default=None,
                   help=f"body fields naming the session, in order (comma list; default {','.join(BODY_FIELDS)}; "
                        "'' for none)")
    g.add_argument("--session-previous-response-id", type=parse_bool, default=True,
                   help="Responses API: a request continuing a response joins its session (true)")
    g.add_argument("--program-header", default=None,
                   help="request header naming the program a session runs (default: the prompt's first 2,048 "
                        "characters and the model)")
    g.add_argument("--session-max-bytes", type=int, default=256,
                   help="longer session values are ignored (256)")
    g.add_argument("--flow-fairness-key", choices=FAIRNESS_KEYS, default="tenant",
                   help="flow control's fairness: per tenant (x-gateway-inference-fairness-id, the default), per "
                        "session or per program (within the tenant)")


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


__all__ = ["FAIRNESS_KEYS", "EarlySettings", "RequestSettings", "SessionSettings", "add_early_flags", "add_flags",
           "add_output_flags", "add_session_flags"]
