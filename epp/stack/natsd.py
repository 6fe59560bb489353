"""A nats-server for `epp stack --bus nats` (and the tests): find the binary, start it as a child on loopback.

Debian ships it as `nats-server` (`apt-get install nats-server`); NATS's releases put the same binary anywhere on
PATH.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from epp.stack.children import Children
from epp.stack.ports import wait_port

CANDIDATES = ("/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")


def nats_binary() -> str:
    """The nats-server binary on PATH (or where Debian puts it); RuntimeError saying how to install it."""
    path = shutil.which("nats-server") or next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)
    if path is None:
        raise RuntimeError("nats-server is not installed: `apt-get install -y nats-server` (Debian), or put NATS's "
                           "release binary on PATH (https://github.com/nats-io/nats-server/releases)")
    return path


def start_nats_server(children: Children, port: int, directory: Path) -> str:
    """Run nats-server on 127.0.0.1:`port` (JetStream on, its store in `directory`); its URL once it accepts."""
    proc = children.spawn("nats", [nats_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd",
                                   str(directory / "nats")])
    wait_port(port, proc=proc, what="nats-server")
    return f"nats://127.0.0.1:{port}"
