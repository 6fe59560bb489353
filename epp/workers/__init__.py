"""`epp serve --workers N`: N worker processes behind one gRPC port, with one metrics endpoint and one health port.

The process started as `epp serve --workers N` is a supervisor (epp/workers/supervisor.py). It
- reserves the gRPC port and starts N workers, each a full `epp serve` that binds the port with SO_REUSEPORT (the
  kernel spreads new connections over the workers) and shares in-flight load and routing state with its siblings
  over the replica bus (ipc sockets in a private directory, or TCP when the replicas of several pods share a bus);
- serves the metrics port itself: /metrics aggregates every worker (prometheus-client's multiprocess mode: exact
  sums of the counters and histograms, dead workers' counts kept, live workers' gauges summed), /-/workers shows
  each worker, and the dashboard is proxied from one worker and says so (epp/workers/front.py);
- serves the gRPC health port itself: live while the group runs, ready only when every worker is ready;
- restarts a worker that dies (with backoff), and fails the whole group loudly (exit code 1, an error naming the
  worker) if a worker cannot start or keeps dying: a crash loop is an outage to report, not to hide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.cmd.settings import ServeSettings
    from epp.workers.control import start_worker_control


def supervise(settings: ServeSettings) -> int:
    """Run the workers of `settings` (the supervisor re-launches `settings.argv` for each)."""
    from epp.workers.supervisor import run_supervisor

    return run_supervisor(settings)


__all__ = ["start_worker_control", "supervise"]


def __getattr__(name: str) -> Any:
    """`start_worker_control` (a worker's control socket, aiohttp) is imported on first use (PEP 562)."""
    if name == "start_worker_control":
        from epp.workers.control import start_worker_control

        return start_worker_control
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
