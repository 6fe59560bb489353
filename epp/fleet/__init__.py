"""The fleet: the datastore (pools, endpoints, in-flight counts), endpoint sources (the endpoints file; Kubernetes in
k8s/), scraping (scrape/), KV events (kvevents/), passive health, saturation detectors, rewrites. Flags and settings:
settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.fleet.datastore import Datastore, InflightTicket, InflightTracker, PoolSnapshot, PoolSpec
    from epp.fleet.passive import PassiveHealth
    from epp.fleet.reload import FileWatcher
    from epp.fleet.rewrites import choose_rewrite
    from epp.fleet.saturation import Detector, SaturationDetector, detector_for
    from epp.fleet.static_source import (
        apply_static,
        parse_static_config,
        parse_static_file,
        parse_static_text,
        read_static_file,
    )

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the CLI
# reads epp.fleet.settings without loading the fleet.
_LAZY = {
    "Datastore": "datastore", "InflightTicket": "datastore", "InflightTracker": "datastore",
    "PoolSnapshot": "datastore", "PoolSpec": "datastore",
    "PassiveHealth": "passive",
    "FileWatcher": "reload",
    "choose_rewrite": "rewrites",
    "Detector": "saturation", "SaturationDetector": "saturation", "detector_for": "saturation",
    "apply_static": "static_source", "parse_static_config": "static_source", "parse_static_file": "static_source",
    "parse_static_text": "static_source", "read_static_file": "static_source",
}

__all__ = ["Datastore", "Detector", "FileWatcher", "InflightTicket", "InflightTracker", "PassiveHealth",
           "PoolSnapshot", "PoolSpec", "SaturationDetector", "apply_static", "choose_rewrite", "detector_for",
           "parse_static_config", "parse_static_file", "parse_static_text", "read_static_file"]


__getattr__ = lazy_exports(__name__, _LAZY)
