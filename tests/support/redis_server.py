"""A real Debian redis-server for tests: on an OS-chosen loopback port, in a temp dir, never daemonized.

`scripts/test.sh` installs redis-server when it is missing (`scripts/bootstrap.sh --test-deps`, which calls
scripts/debian-packages.sh).
The server can be paused (SIGSTOP: it stops answering, connections hang), resumed, killed and restarted on the
same port, which is how the tests make Redis hang, die and come back.
"""

from __future__ import annotations

import os
import shutil

from tests.support.server_process import ServerProcess


def redis_binary() -> str:
    path = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                            else None)
    if path is None:
        raise RuntimeError("redis-server is not installed: run `bash scripts/bootstrap.sh --test-deps` (it installs "
                           "Debian's redis-server) or `apt-get install -y redis-server`")
    return path


class RedisServer(ServerProcess):
    what = "redis-server"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        return [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--daemonize", "no", "--logfile", self.log_path, "--protected-mode", "yes"]

    def start(self, port: int | None = None) -> RedisServer:
        super().start(port)
        return self
