"""`epp stack --example kthena`: a Kthena ModelRoute over two ModelServers of the simulated servers.

The servers are split in two ModelServers (`llama-v1`: the first half, `llama-v2`: the rest; both serve the stack's
model, which the route's virtual model name is overwritten to), and the ModelRoute `deepseek` sends premium users
(`x-user-tier: premium`) to v2 and splits the others 70/30 between v1 and v2.
"""

from __future__ import annotations

import yaml

MODEL_NAME = "deepseek-r1"


def routes(ports: list[int], model: str) -> str:
    """Two ModelServers over the simulated servers (v1: the first half, v2: the rest; both serve `model`, which the
    route's virtual model name is overwritten to) and a ModelRoute: premium users to v2, the others 70/30."""
    half = max(1, len(ports) // 2)
    groups = {"v1": ports[:half], "v2": ports[half:] or ports[:half]}
    docs = []
    for name, ps in groups.items():
        docs.append({"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelServer",
                     "metadata": {"name": f"llama-{name}", "namespace": "default"},
                     "spec": {"model": model, "inferenceEngine": "vLLM", "workloadPort": {"port": ps[0]},
                              "endpoints": [{"name": f"sim-{p}", "address": "127.0.0.1", "port": p} for p in ps],
                              "trafficPolicy": {"retry": {"attempts": 1}}}})
    docs.append({"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelRoute",
                 "metadata": {"name": "deepseek", "namespace": "default"},
                 "spec": {"modelName": MODEL_NAME, "rules": [
                     {"name": "premium", "modelMatch": {"headers": {"x-user-tier": {"exact": "premium"}}},
                      "targetModels": [{"modelServerName": "llama-v2"}]},
                     {"name": "canary", "targetModels": [{"modelServerName": "llama-v1", "weight": 70},
                                                         {"modelServerName": "llama-v2", "weight": 30}]}]}})
    return yaml.safe_dump_all(docs, sort_keys=False)


def ready(url: str, grpc_port: int, metrics_port: int, epp: str, model: str) -> str:
    body = f'{{"model": "{MODEL_NAME}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    return f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'
  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -H 'x-user-tier: premium' -d '{body}'

Explain a decision (the rule, the split and the pick):
  {epp} explain --addr 127.0.0.1:{grpc_port} --body '{body}'
  {epp} explain --addr 127.0.0.1:{grpc_port} -H 'x-user-tier: premium' --body '{body}'
"""


def describe() -> str:
    return f"ModelRoute {MODEL_NAME}: premium -> v2, others 70/30 v1/v2"
