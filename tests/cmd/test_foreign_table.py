"""The foreign-flag table (epp/cmd/foreign.py) covers every flag the other EPPs define, agrees with `epp serve`'s own
flags, and docs/deploy.md "Foreign flags" lists every entry and spelling."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from epp.argtypes import parse_bool
from epp.cmd.foreign import ALIASES, BY_NAME, FOREIGN_FLAGS, NATIVE, kinds_of
from epp.cmd.settings import add_serve_flags

ROOT = Path(__file__).resolve().parents[2]

# Every distinct flag name of GIE v1.0-v1.6 and llm-d-router v0.9-main (their options.go / runner.go).
UPSTREAM = (
    "allow-experimental-plugins cache-info-metric cert-path config-file config-text disable-endpoint-subset-filter "
    "drain-timeout emit-endpoint-scores enable-cert-reload enable-grpc-stream-metrics enable-pprof endpoint-selector "
    "endpoint-target-ports grpc-health-port grpc-max-recv-msg-size grpc-max-send-msg-size grpc-port "
    "ha-enable-leader-election health-checking kv-cache-usage-percentage-metric lora-info-metric metrics-cert-dir "
    "metrics-client-ca-file metrics-endpoint-auth metrics-port metrics-staleness-threshold "
    "model-server-metrics-https-insecure-skip-verify model-server-metrics-path model-server-metrics-port "
    "model-server-metrics-scheme pool-group pool-name pool-namespace refresh-metrics-interval "
    "refresh-prometheus-metrics-interval secure-serving tls-cipher-suites tls-min-version "
    "total-queued-requests-metric total-running-requests-metric tracing v zap-devel zap-encoder zap-log-level "
    "zap-stacktrace-level zap-time-encoding").split()
# KServe's and llm-d-deployer's camelCase spellings.
CAMEL = ("poolName poolNamespace grpcPort grpcHealthPort secureServing certPath modelServerMetricsScheme "
         "modelServerMetricsHttpsInsecureSkipVerify").split()


def serve_kinds() -> dict[str, str]:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return kinds_of(p, parse_bool)[0]


def test_every_upstream_flag_and_spelling_is_in_the_table():
    assert len(UPSTREAM) == 47
    assert set(UPSTREAM) <= set(BY_NAME), set(UPSTREAM) - set(BY_NAME)
    assert set(CAMEL) <= set(ALIASES)
    assert set(ALIASES.values()) <= set(BY_NAME)


def test_native_means_epp_serve_defines_it_and_the_others_it_does_not():
    kinds = serve_kinds()
    for f in FOREIGN_FLAGS:
        if f.how == NATIVE:
            assert f.name in kinds, f"--{f.name} is said to be native but epp serve does not define it"
            assert (kinds[f.name] == "bool") == (f.kind == "bool"), f"--{f.name}: boolean in one only"
        else:
            assert f.name not in kinds, f"--{f.name} is both Pointsman's and foreign"
        if f.translate is not None:
            assert all(o.name in kinds for o in f.translate(_sample(f.name))), f.name


def _sample(name: str) -> str:
    return {"zap-encoder": "json", "zap-log-level": "debug", "grpc-max-recv-msg-size": "10MiB",
            "ha-enable-leader-election": "true"}.get(name, "vllm:num_requests_waiting")


def test_the_docs_list_every_flag_and_spelling():
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## Foreign flags"):]
    section = section[:section.index("\n## ", 5)]
    listed = set(re.findall(r"^\| `--([A-Za-z-]+)` \|", section, re.M))
    assert {f.name for f in FOREIGN_FLAGS} | set(ALIASES) <= listed, \
        ({f.name for f in FOREIGN_FLAGS} | set(ALIASES)) - listed
