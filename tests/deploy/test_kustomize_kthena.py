"""deploy/kthena: with deploy/, it grants exactly what --watch-routes and the pool watchers read."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from epp.cmd.cli import build_parser
from epp.fleet.k8s import ROUTE_RESOURCES, WATCH_VERBS, WATCHED_RESOURCES

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")


def render(path: Path) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kthena_addon_grants_exactly_the_route_resources():
    docs = render(ROOT / "deploy") + render(ROOT / "deploy" / "kthena")
    sa = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    have = set()
    for b in (d for d in docs if d["kind"] == "RoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            for rule in roles[b["roleRef"]["name"]]["rules"]:
                have |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    need = {(r.group, r.plural, v) for r in (*WATCHED_RESOURCES, *ROUTE_RESOURCES) for v in WATCH_VERBS}
    assert have == need


def test_the_environment_the_addon_documents_turns_the_features_on(monkeypatch):
    monkeypatch.setenv("POINTSMAN_WATCH_ROUTES", "true")
    monkeypatch.setenv("EPP_SERVICE_NAME", "pointsman-epp")
    args = build_parser().parse_args(["serve"])
    assert args.watch_routes is True and args.epp_service_name == "pointsman-epp"
    monkeypatch.delenv("POINTSMAN_WATCH_ROUTES")
    monkeypatch.delenv("EPP_SERVICE_NAME")
    args = build_parser().parse_args(["serve"])
    assert args.watch_routes is False and args.epp_service_name is None
