"""Hot reload: poll a config file and apply a new version only when it parses.

`FileWatcher(path, parse=..., apply=..., interval=1.0)` checks the file every `interval` seconds. A change is
detected by (mtime_ns, size, inode) first, then confirmed by a content hash, so a rewrite with identical content
(or a Kubernetes ConfigMap symlink swap to the same data) does not re-apply. The new text goes through `parse`;
only a successful parse reaches `apply`. A parse (or apply) failure is logged with the reason and the previous
configuration keeps serving; the same broken content is reported once, not every poll.

`parse` receives the file text (the endpoints file's: `static_source.parse_static_text`).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from epp.aio import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")


class FileWatcher(Generic[T]):
    def __init__(
        self,
        path: str | Path,
        parse: Callable[[str], T],
        apply: Callable[[T], Any] | Callable[[T], Awaitable[Any]],
        interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.parse = parse
        self.apply = apply
        self.interval = interval
        self.current: T | None = None
        self.reloads = 0  # successful applies, the initial load included
        self.failures = 0  # rejected versions
        self.last_error: str | None = None
        self.applied_at: float | None = None  # wall-clock time of the last successful apply
        self.rejected_at: float | None = None  # wall-clock time of the last rejected version
        self._stat: tuple[int, int, int] | None = None
        self._applied_hash: str | None = None
        self._rejected_hash: str | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- one check ---------------------------------------------------------------------------------------
    def _read(self) -> tuple[tuple[int, int, int], bytes] | None:
        try:
            st = os.stat(self.path)
            data = self.path.read_bytes()
        except OSError as e:
            if self.last_error != f"cannot read {self.path}: {e}":
                self.last_error = f"cannot read {self.path}: {e}"
                log.error("config reload: %s; keeping the current configuration", self.last_error)
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino), data

    async def load_initial(self) -> T:
        """Read, parse and apply the file now. Raises on a bad file: at startup there is nothing to fall back to."""
        got = self._read()
        if got is None:
            raise FileNotFoundError(self.last_error or str(self.path))
        stat, data = got
        parsed = self.parse(data.decode("utf-8"))
        await self._apply(parsed)
        self._stat, self._applied_hash = stat, hashlib.sha256(data).hexdigest()
        return parsed

    async def check_once(self) -> bool:
        """Poll once; True if a new version was applied."""
        got = self._read()
        if got is None:
            return False
        stat, data = got
        if stat == self._stat:
            return False
        self._stat = stat
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._applied_hash or digest == self._rejected_hash:
            return False
        try:
            parsed = self.parse(data.decode("utf-8"))
            await self._apply(parsed)
        except Exception as e:  # any parse/validation/apply error: keep the old config
            self.failures += 1
            self.rejected_at = time.time()
            self._rejected_hash = digest
            self.last_error = f"{type(e).__name__}: {e}"
            log.error("config reload of %s rejected, the previous configuration keeps serving: %s", self.path, e)
            return False
        self._applied_hash, self._rejected_hash, self.last_error = digest, None, None
        log.info("config reloaded from %s", self.path)
        return True

    async def _apply(self, parsed: T) -> None:
        result = self.apply(parsed)
        if inspect.isawaitable(result):
            await result
        self.current = parsed
        self.reloads += 1
        self.applied_at = time.time()

    # ---- the loop ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_once()
            except Exception:  # never let the watcher die
                log.exception("config watcher for %s failed a poll", self.path)

    def start(self) -> asyncio.Task[None]:
        """Start polling on the running loop (call `load_initial` first to apply the starting config)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"reload:{self.path}")
        return self._task

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
