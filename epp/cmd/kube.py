"""The Kubernetes client and the namespace-wide pod watch that `epp serve`'s watchers share (epp/cmd/fleet.py,
epp/cmd/routing.py, the metrics auth): both made on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.cmd.runner import Runner
from epp.fleet import Datastore
from epp.fleet.settings import SourceSettings

if TYPE_CHECKING:
    import kubernetes.client as k8s

    from epp.fleet.k8s import PodPools


class Kube:
    """One Kubernetes API client for every watcher, and the namespace-wide pod watch shared by the watchers of
    several pools; both made on first use (the pod watch is then a component of the runner)."""

    def __init__(self, datastore: Datastore, settings: SourceSettings, runner: Runner) -> None:
        self.datastore = datastore
        self.settings = settings
        self.runner = runner
        self._api: k8s.ApiClient | None = None
        self.pods: PodPools | None = None

    def api(self) -> k8s.ApiClient:
        if self._api is None:
            from epp.fleet.k8s import make_api_client

            self._api = make_api_client(kubeconfig=self.settings.kubeconfig)
        return self._api

    def pod_pools(self) -> PodPools:
        if self.pods is None:
            from epp.fleet.k8s import PodPools

            self.pods = PodPools(self.datastore, self.api(), self.settings.pool_namespace)
            self.pods.start()
            self.runner.own("pod watch", self.pods)
        return self.pods


__all__ = ["Kube"]
