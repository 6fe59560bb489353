"""metrics-data-source (llm-d data layer): where the shell scrapes each endpoint's Prometheus metrics.

    URL = <scheme>://<endpoint ip:port><path>         scheme "http" (or "https"), path "/metrics"
    insecureSkipVerify (true, llm-d's default): with https, do not verify the server certificate

Referenced from an EndpointPickerConfig's `dataLayer.sources[].pluginRef` (or the older `data` section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from scheduling.framework import BuildContext, ConfigError, System, register
from scheduling.framework.errors import join_path


@dataclass(frozen=True)
class Params:
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    insecureSkipVerify: bool = True


@register("metrics-data-source")
class MetricsDataSource(System[Params]):
    Params = Params

    def setup(self, build: BuildContext) -> None:
        if not self.params.path.startswith("/"):
            raise ConfigError(build.source, join_path(build.path, "path"),
                              f"expected an absolute URL path such as /metrics, got {self.params.path!r}")
