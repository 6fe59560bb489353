"""The routing layer: routes -> rules -> weighted targets, each a pool of endpoints or an external provider.

model.py (the typed route model) · matcher.py (pure matching, injected RNG) · kthena.py + kthena_backends.py
(Kthena's documents) · llmkube*.py (LLMKube's ModelRouter: llmkube.py + llmkube_backends.py read it,
llmkube_model.py holds it, llmkube_match.py decides, llmkube_router.py applies it, llmkube_balance.py balances a
backend's pods) · classification.py (LLMKube's classification guard) · quarantine.py (response-path failures) ·
documents.py (per-document compile, last good version) · router.py (the decision the director applies) · pools.py
(backends as datastore pools, P/D scheduler) · sticky.py · providers.py · service.py (files, Kubernetes, metrics) ·
k8s.py (the Kubernetes watch).
"""
