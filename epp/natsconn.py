"""Where a NATS server is and how to log in: one target parsed from a URL list and flags, and the connection.

    NatsTarget.parse("nats://alice:s3cret@10.0.0.5:4222,nats://10.0.0.6:4222", creds="/etc/nats/user.creds")
    target.redacted()   ->  "nats://10.0.0.5:4222,nats://10.0.0.6:4222 (user alice, password, creds file ...)"
    nc = await connect(target, name="pointsman-bus", disconnected_cb=...)

Credentials come as NATS clients take them: user and password or a token in the URL (`nats://user:pass@host`,
`nats://token@host`), a credentials file (JWT and NKey seed, `creds`), or TLS (a `tls://` URL, or a CA, a client
certificate and key). The target keeps them out of its repr and out of `redacted()`, which is what logs show.
nats-py (the 'replicas' extra) is imported only by `connect`.
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from nats.aio.client import Client

SCHEMES = ("nats", "tls")
DEFAULT_PORT = 4222
# nats-py's reconnect settings unless a caller sets its own: reconnect forever, half a second apart (a Pointsman
# process outlives a broker's restart, and routing never waits on it)
RECONNECT = {"allow_reconnect": True, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5}


class NatsConfigError(ValueError):
    """A NATS URL or option that cannot be used; the message names it without its secrets."""


@dataclass(frozen=True)
class NatsTarget:
    servers: tuple[str, ...]  # scheme://host:port, without credentials
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = None  # a credentials file (JWT and NKey seed)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def parse(cls, urls: str, *, creds: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
              tls_key: str | None = None) -> NatsTarget:
        """A comma list of nats:// or tls:// URLs (credentials in the first one that has them); NatsConfigError
        naming what is wrong."""
        servers: list[str] = []
        target = cls((), creds=creds, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        for item in filter(None, (u.strip() for u in urls.split(","))):
            server, user, password, token = _server(item)
            servers.append(server)
            if (user or token) and not (target.user or target.token):
                target = dataclasses.replace(target, user=user, password=password, token=token)
        if not servers:
            raise NatsConfigError("a NATS URL is needed: nats://host:port[,...]")
        if bool(tls_cert) != bool(tls_key):
            raise NatsConfigError("a NATS client certificate needs both the certificate and its key")
        return dataclasses.replace(target, servers=tuple(servers))

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert) or any(s.startswith("tls://") for s in self.servers)

    def redacted(self) -> str:
        """The servers and which kinds of credentials are set, never the secrets themselves."""
        how = [f"user {self.user}"] if self.user else []
        how += [k for k, v in (("password", self.password), ("token", self.token)) if v]
        how += [f"creds file {self.creds}"] if self.creds else []
        how += ["tls"] if self.tls else []
        return ",".join(self.servers) + (f" ({', '.join(how)})" if how else "")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx


def _server(url: str) -> tuple[str, str | None, str | None, str | None]:
    """One URL -> (scheme://host:port, its user, password and token); errors show the URL without its secrets."""
    parts = urlsplit(url)
    shown = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url
    if parts.scheme not in SCHEMES:
        raise NatsConfigError(f"NATS URL {shown!r}: the scheme must be nats:// or tls://")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise NatsConfigError(f"NATS URL {shown!r}: bad port") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise NatsConfigError(f"NATS URL {shown!r}: expected {parts.scheme}://[user:password@]host[:port]")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    server = f"{parts.scheme}://{host}:{port}"
    if parts.username and parts.password is not None:
        return server, unquote(parts.username), unquote(parts.password), None
    return server, None, None, unquote(parts.username) if parts.username else None


async def connect(target: NatsTarget, *, name: str, **options: Any) -> Client:
    """A connected nats-py client for `target`; `options` (callbacks, reconnect settings...) go to nats.connect, over
    RECONNECT's defaults."""
    try:
        import nats
    except ImportError:
        raise ImportError("NATS needs the 'replicas' extra: pip install 'pointsman[replicas]'", name="nats") from None
    login: dict[str, Any] = {}
    if target.user:
        login.update(user=target.user, password=target.password)
    if target.token:
        login["token"] = target.token
    if target.creds:
        login["user_credentials"] = target.creds
    tls = target.ssl_context()
    if tls is not None:
        login["tls"] = tls
    client: Client = await nats.connect(servers=list(target.servers), name=name, **login, **{**RECONNECT, **options})
    return client


__all__ = ["NatsConfigError", "NatsTarget", "connect"]
