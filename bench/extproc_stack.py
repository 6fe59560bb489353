"""The processes behind bench_extproc.py: a keep-alive backend, front Envoys, processors, vllm-router.

Every path of the benchmark ends at the same backend: one Envoy with four `direct_response` listeners returning a
fixed chat completion. Its HTTP connection manager runs the buffer filter before the router, so the request body is
read before the direct response is sent. Without it Envoy answers a POST before its body has arrived and then
closes the connection (`connection: close`): every proxied request opened a new upstream TCP connection and left a
socket in TIME_WAIT (tens of thousands per run), so the benchmark measured connection setup rather than routing.
`--upstream close` brings that behaviour back for comparison; the upstream-connections column shows which it is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from epp.envoy_config import EnvoyConfigSpec, render  # noqa: E402
from epp.stack.ports import wait_port  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"
REPLY = ('{"id":"x","object":"chat.completion","choices":[{"message":{"content":"Paris"}}],'
         '"usage":{"prompt_tokens":9,"completion_tokens":1}}')
_FILLER = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report on "
           "distributed inference, prefix caches and the cost of every extra hop in the data path. ")


def chat_body(size: int, model_last: bool = False) -> str:
    """An OpenAI chat body of exactly `size` bytes (at least the 107 of the shortest one); `model_last`: `messages`
    before `model`, as OpenAI's Python client writes a body."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    base = {"messages": question, "model": MODEL} if model_last else {"model": MODEL, "messages": question}
    text = json.dumps(base, separators=(",", ":"))
    if size <= len(text):
        return text
    pad = size - len(text) - 1  # one space between the filler and the question
    filler = (_FILLER * (pad // len(_FILLER) + 1))[:pad]
    question[0]["content"] = filler + " What is the capital of France?"
    body = json.dumps(base, separators=(",", ":"))
    assert len(body) == size, (len(body), size)
    return body


def wrk_script(body: str) -> str:
    return (f'wrk.method = "POST"\nwrk.body = [==[{body}]==]\n'
            'wrk.headers["Content-Type"] = "application/json"\nwrk.path = "/v1/chat/completions"\n')


def bin_path(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def backend_config(ports: list[int], admin: int, *, keep_alive: bool = True) -> dict:
    router = {"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    buffer = {"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": 1 << 22}}
    listeners = []
    for p in ports:
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                     "HttpConnectionManager",
            "stat_prefix": f"b{p}",
            "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": REPLY}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
            }]}]},
            # The buffer filter reads the whole request before the router answers: the connection stays open.
            "http_filters": [buffer, router] if keep_alive else [router],
        }
        listeners.append({"name": f"b{p}", "address": {"socket_address": {"address": "127.0.0.1", "port_value": p}},
                          "per_connection_buffer_limit_bytes": 1 << 22,
                          "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                          "typed_config": hcm}]}]})
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": listeners}}


def direct_config(listen: int, admin: int, ports: list[int]) -> dict:
    """The generated override-host bootstrap without ext_proc: round robin over the backend."""
    cfg = render(EnvoyConfigSpec(variant="override-host", listen_port=listen, admin_port=admin,
                                 endpoints=[("127.0.0.1", p) for p in ports]))
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = hcm["http_filters"][-1:]  # router only: no ext_proc
    cluster = cfg["static_resources"]["clusters"][1]
    cluster.pop("load_balancing_policy")
    cluster["lb_policy"] = "ROUND_ROBIN"
    cfg["static_resources"]["clusters"] = [cluster]
    return cfg


def front_config(listen: int, admin: int, processor: int, *, variant: str, phases: str,
                 backends: list[int], epp_workers: int = 1) -> dict:
    """`variant` may carry the request body mode: `original-dst+BUFFERED`."""
    variant, _, body_mode = variant.partition("+")
    spec = EnvoyConfigSpec(variant=variant, listen_port=listen, admin_port=admin, epp_port=processor,
                           response_phases=phases, epp_workers=epp_workers, request_body_mode=body_mode,
                           endpoints=[("127.0.0.1", p) for p in backends] if variant == "override-host" else [])
    return render(spec)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all threads, and of its live children (the workers of `epp serve --workers
    N`), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                total += cpu_seconds(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


def backend_connections(admin: int) -> int:
    """Connections the backend has accepted so far (its HTTP connection managers' downstream_cx_total; the
    listener-level copies of the same counter are left out)."""
    pattern = r"^http\.b[0-9]+\.downstream_cx_total$"
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?format=json&filter={pattern}", timeout=5) as r:
        stats = json.load(r)["stats"]
    return sum(int(s.get("value", 0)) for s in stats if "name" in s)


class Procs:
    """Processes started by the benchmark, stopped (by their own pid) in `stop`."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.dir = Path(tempfile.mkdtemp(prefix="bench-extproc-"))

    def envoy(self, name: str, cfg: dict, listen: int) -> subprocess.Popen:
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        p = subprocess.Popen([bin_path("envoy"), "-c", str(path), "--concurrency", "1", "--use-dynamic-base-id",
                              "--log-level", "error"], stdout=subprocess.DEVNULL,
                             stderr=open(self.dir / f"{name}.log", "ab"))  # noqa: SIM115
        self.procs.append(p)
        wait_port(listen, proc=p, what=name)
        return p

    def spawn(self, name: str, cmd: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.dir / f"{name}.log", "ab"),  # noqa: SIM115
                             env={**os.environ, **(env or {})})
        self.procs.append(p)
        wait_port(port, proc=p, what=name)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
