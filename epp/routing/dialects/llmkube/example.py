"""`epp stack --example llmkube`: an LLMKube ModelRouter over two simulated InferenceServices.

The simulated servers are split in two standalone pools named after their InferenceServices (`qwen3-coder`: the
first half, `llama`: the rest; both serve the stack's model), and the ModelRouter routes between them:
- `pii-stays-local`: `x-llmkube-classification: pii|phi` -> qwen (fail-closed);
- `complex`: `x-llmkube-task-complexity: complex` -> llama, then qwen (primary-fallback);
- `canary`: `x-canary: 1` -> qwen 3 : llama 1 (weighted);
- anything else -> the default route, qwen (LoadAware with prefix and session affinity).
Budgets: 200,000 tokens an hour for the router, 20,000 per team (`x-llmkube-team`) per 10 minutes, priced by the
backends' costPerMillionTokens. Quarantine: 5 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

NAME = "coding-router"
SERVICES = ("qwen3-coder", "llama")


def pools(ports: list[int], endpoint: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """The two InferenceServices' endpoints (the first half of the servers, and the rest), each as the stack
    writes a server into the endpoints file (`endpoint(port)`)."""
    half = max(1, len(ports) // 2)
    groups = {SERVICES[0]: ports[:half], SERVICES[1]: ports[half:] or ports[:half]}
    return [{"name": svc, "endpoints": [endpoint(p) for p in ps]} for svc, ps in groups.items()]


def routes(ports: list[int], model: str) -> str:
    """The ModelRouter (its backends are the endpoints file's two InferenceService pools: see `pools`)."""
    doc = {
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {
            "backends": [
                {"name": "qwen", "displayName": "qwen3-coder", "tier": "local", "resolution": "endpoint",
                 "inferenceServiceRef": {"name": "qwen3-coder"}, "capabilities": ["tools", "long-context"],
                 "weight": 3, "costPerMillionTokens": {"promptUSD": "0.10", "completionUSD": "0.40"},
                 "balancing": {"mode": "LoadAware", "prefixAffinity": {},
                               "sessionAffinity": {"headers": ["x-session-id"]}}},
                {"name": "llama", "tier": "local", "inferenceServiceRef": {"name": "llama"}, "weight": 1,
                 "capabilities": ["tools"], "costPerMillionTokens": {"promptUSD": "0.05", "completionUSD": "0.20"}},
            ],
            "rules": [
                {"name": "pii-stays-local", "match": {"dataClassification": ["pii", "phi"]},
                 "route": {"backends": ["qwen"]}, "failClosed": True},
                {"name": "complex", "match": {"taskComplexity": "complex"},
                 "route": {"backends": ["llama", "qwen"], "strategy": "primary-fallback", "timeout": "60s"}},
                {"name": "canary", "match": {"headers": {"x-canary": "1"}},
                 "route": {"backends": ["qwen", "llama"], "strategy": "weighted"}},
            ],
            "defaultRoute": "qwen",
            "policy": {"budgets": [
                {"name": "stack-hourly", "scope": "router", "maxTokens": 200_000, "maxUSD": "1.00",
                 "windowSeconds": 3600},
                {"name": "per-team", "scope": "team", "maxTokens": 20_000, "windowSeconds": 600},
            ]},
            "proxy": {"quarantineDuration": "5s", "streamIdleTimeout": "60s", "replicas": 1},
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


def ready(url: str, grpc_port: int, metrics_port: int, epp: str, model: str) -> str:
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    return f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'
  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -H 'x-llmkube-task-complexity: complex' \\
    -H 'x-llmkube-team: red' -d '{body}'

Explain a decision (the rule, the backend, the endpoint, the budgets):
  {epp} explain --addr 127.0.0.1:{grpc_port} --body '{body}'
  {epp} explain --addr 127.0.0.1:{grpc_port} -H 'x-llmkube-classification: PII' -H 'x-llmkube-team: red' --body '{body}'

Dashboard:           http://127.0.0.1:{metrics_port}/   (the config view shows the budgets' state)
Pointsman metrics:   http://127.0.0.1:{metrics_port}/metrics   (pointsman_budget_utilization)
"""


def describe() -> str:
    return f"ModelRouter {NAME}: pii -> qwen, complex -> llama, budgets"
