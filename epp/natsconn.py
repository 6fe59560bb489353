"""Where a NATS server is and how to reach it: `NatsTarget.parse(url)` (a frozen target: the servers, credentials
and TLS files) and `await connect(target, name=..., **callbacks)` (a nats-py client that reconnects forever).

A URL is ``nats://host:port`` (``tls://`` for TLS), several comma-separated for a cluster; user and password may
stand in it (``nats://user:secret@host:4222``). `redacted()` is the form for logs and metrics: credentials never
reach them. nats-py is imported only by `connect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("nats", "tls")


class NatsConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class NatsTarget:
    servers: tuple[str, ...]  # nats://host:port, credentials included
    creds_file: str | None = None  # a NATS .creds file (JWT + nkey seed)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def parse(cls, url: str, *, creds_file: str | None = None, tls_ca: str | None = None,
              tls_cert: str | None = None, tls_key: str | None = None) -> NatsTarget:
        """NatsConfigError naming what is wrong for anything but nats://host:port[,nats://host:port...]."""
        servers = []
        for part in (p.strip() for p in url.split(",")):
            if not part:
                continue
            try:
                u = urlsplit(part)
                port = u.port
            except ValueError as e:
                raise NatsConfigError(f"NATS URL {_redact(part)!r}: {e}") from None
            if u.scheme not in SCHEMES or not u.hostname or port is None:
                raise NatsConfigError(f"NATS URL {_redact(part)!r}: expected nats://host:port or tls://host:port")
            servers.append(part)
        if not servers:
            raise NatsConfigError("NATS URL: expected nats://host:port")
        if (tls_cert is None) != (tls_key is None):
            raise NatsConfigError("NATS TLS: a client certificate needs its key, and a key its certificate")
        return cls(tuple(servers), creds_file, tls_ca, tls_cert, tls_key)

    def redacted(self) -> str:
        """The servers without credentials, for logs."""
        return ",".join(_redact(s) for s in self.servers)

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None or any(s.startswith("tls:") for s in self.servers)


def _redact(server: str) -> str:
    u = urlsplit(server)
    if "@" not in u.netloc:
        return server
    return u._replace(netloc="***@" + u.netloc.rpartition("@")[2]).geturl()


async def connect(target: NatsTarget, *, name: str, **callbacks: Any) -> Any:
    """A connected nats-py client (reconnecting forever, 0.5 s apart) for `target`; `callbacks` are nats-py's
    (error_cb, disconnected_cb, reconnected_cb, closed_cb). Raises what nats-py raises when no server answers."""
    import nats

    opts: dict[str, Any] = {"name": name, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,
                            "allow_reconnect": True, **callbacks}
    if target.creds_file is not None:
        opts["user_credentials"] = target.creds_file
    if target.tls:
        import ssl

        ctx = ssl.create_default_context(cafile=target.tls_ca)
        if target.tls_cert is not None:
            ctx.load_cert_chain(target.tls_cert, target.tls_key)
        opts["tls"] = ctx
    return await nats.connect(list(target.servers), **opts)


__all__ = ["NatsConfigError", "NatsTarget", "connect"]
