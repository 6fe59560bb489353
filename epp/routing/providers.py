"""External providers: the upstream path, the headers Pointsman sets and removes, and the credentials.

The request keeps flowing through Envoy: Pointsman sets the provider header (Envoy's route for that provider
sends it to the provider's HTTPS cluster), rewrites `:path` for the provider's base URL, sets the credential and the
static headers, rewrites the model, and removes every client header that is not on the forward list, so client
credentials and cookies never reach a third party (Kthena forwards the same list).

Paths (as Kthena): OpenAI takes /v1/chat/completions, /v1/completions and /v1/responses; Anthropic takes
/v1/messages. The path is appended to the base URL's path; an OpenAI base URL with a path drops the request's
leading /v1 (https://host/v1beta/openai + /v1/chat/completions -> /v1beta/openai/chat/completions), and so does
an Anthropic base URL ending in /v1. Other paths are a 400.

Credentials: `Authorization: Bearer <secret>` (OpenAI's default), `x-api-key: <secret>` (Anthropic's default), or
`auth.scheme`. The value comes from a Secret: watched in Kubernetes, or read from a mounted directory standalone
(<dir>/<secret name>/<key>, the layout of a Secret volume). A credential value never appears in logs, explain
output, metrics or error messages: errors say which Secret and key, never what is in it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from epp.routing.model import ProviderBackend

log = logging.getLogger(__name__)

PROVIDER_HEADER = "x-pointsman-provider"
PATHS = {
    "OpenAI": ("/v1/chat/completions", "/v1/completions", "/v1/responses"),
    "Anthropic": ("/v1/messages",),
}
FORWARD = frozenset((
    "content-type", "content-length", "accept", "x-request-id", "traceparent", "tracestate", "baggage",
    "x-b3-traceid", "x-b3-spanid", "x-b3-parentspanid", "x-b3-sampled", "x-b3-flags",
))
PROTOCOL_FORWARD = {"Anthropic": frozenset(("anthropic-version", "anthropic-beta"))}
# Headers Envoy owns or may not be changed by ext_proc: never listed for removal.
_KEEP_PREFIXES = (":", "x-envoy-", "x-forwarded-")
_KEEP = frozenset(("host", "te", "transfer-encoding"))
CREDENTIAL_HEADERS = frozenset(("authorization", "x-api-key"))


def upstream_path(p: ProviderBackend, path: str) -> str | None:
    """The provider's path for a request path (query kept), or None when the provider does not take that path."""
    bare, sep, query = path.partition("?")
    if bare not in (p.paths or PATHS[p.provider_type]):
        return None
    trim = bool(p.base_path) if p.provider_type == "OpenAI" else p.base_path.endswith("/v1")
    suffix = bare[len("/v1"):] if trim else bare
    return f"{p.base_path}{suffix}" + (f"?{query}" if sep else "")


def credential_header(p: ProviderBackend, credential: str) -> tuple[str, str]:
    assert p.auth is not None
    if p.auth.scheme == "Bearer":
        return "authorization", f"Bearer {credential}"
    return "x-api-key", credential


def client_headers_to_remove(p: ProviderBackend, headers: Mapping[str, str], setting: set[str]) -> list[str]:
    """Every client header a provider must not see: not forwarded, not Envoy's, not one Pointsman sets."""
    allowed = FORWARD | PROTOCOL_FORWARD.get(p.provider_type, frozenset())
    out = []
    for name in headers:
        if name in allowed or name in setting or name in _KEEP or name.startswith(_KEEP_PREFIXES):
            continue
        out.append(name)
    for name in CREDENTIAL_HEADERS:  # always: a client credential never reaches a provider
        if name not in out and name not in setting:
            out.append(name)
    return sorted(out)


def normalize_credential(raw: bytes | str) -> str | None:
    """Trimmed, and safe in a header value; None when empty or unusable (never says why with the value)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    if not text or any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in text):
        return None
    return text


class Credentials:
    """Where provider credentials come from: Kubernetes Secrets (set by the watcher) and/or a mounted directory."""

    def __init__(self, secrets_dir: str | Path | None = None) -> None:
        self.secrets_dir = Path(secrets_dir) if secrets_dir else None
        self._secrets: dict[tuple[str, str], dict[str, bytes]] = {}  # (namespace, name) -> data (Kubernetes)
        self._files: dict[str, tuple[tuple[int, int], str | None]] = {}  # path -> (stat, credential)

    # ---- Kubernetes Secrets (the watcher is the one writer) -----------------------------------------------------
    def set_secret(self, namespace: str, name: str, data: Mapping[str, bytes]) -> None:
        self._secrets[(namespace, name)] = dict(data)

    def remove_secret(self, namespace: str, name: str) -> None:
        self._secrets.pop((namespace, name), None)

    def has_secret(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._secrets

    # ---- lookups -------------------------------------------------------------------------------------------
    def get(self, namespace: str, name: str, key: str) -> str | None:
        data = self._secrets.get((namespace, name))
        if data is not None and key in data:
            return normalize_credential(data[key])
        if self.secrets_dir is not None:
            return self._from_file(self.secrets_dir / name / key)
        return None

    def _from_file(self, path: Path) -> str | None:
        """A mounted Secret file, re-read only when it changed (Secret volumes swap a symlink on update)."""
        try:
            st = os.stat(path)
        except OSError:
            self._files.pop(str(path), None)
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        cached = self._files.get(str(path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            value = normalize_credential(path.read_bytes())
        except OSError as e:
            log.error("cannot read the provider credential file %s: %s", path, e.strerror)
            return None
        if value is None:
            log.error("the provider credential in %s is empty or holds characters a header cannot carry", path)
        self._files[str(path)] = (stamp, value)
        return value
