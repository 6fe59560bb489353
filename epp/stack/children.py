"""Child processes that never outlive the process that started them (the local stack, the benchmarks).

The local stack starts modelsim, Pointsman and Envoy in sessions of their own (so Ctrl-C reaches only the stack,
which stops them in order). If the stack itself is killed (SIGKILL, a test's timeout), nothing would stop them:
on Linux `die_with_parent` asks the kernel to send them SIGTERM when their parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGTERM when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
