"""The latency model: what a request would take on each endpoint, in seconds, and what Pointsman learns to predict
it (docs/latency-model.md). Pure: no I/O, time passed in.

- `LatencyModel` (estimator.py): the cost of a request per candidate, its TTFT and TPOT, what a pick and a finished
  request change; one per scorer. Its parts, each with its own state:
  - `SharedBacklog` (backlog.py): the prefill each endpoint still has to work off, shared with peers;
  - `Learner` (learner.py): D(e) and the calibration k(e) from finished requests, replicated as records;
  - `EngineTimingTable` (table.py) of `EndpointFit`s (fit.py; estimates.py, scrapes.py): timings fitted from the
    engines' histograms, and the backlog weight β(e);
  - `TrustTable` (trust.py): how much a predicted prefix hit is believed.
- `OutsideLoad` (outside.py): the requests each engine runs that Pointsman did not send, from the scrapes.
- `ModelConfig` (config.py): its settings and the batch slowdown.
- SLOs: the objectives a request states (slo.py), the tiers a decision ranks them in (tiers.py), and the classes
  that make a request with more slack yield the short queues to one with less (classes.py), and wait while the
  endpoint it would take has tight work pending (hold.py).

The estimated-latency scorer (scheduling/plugins/scorers/estimated_latency.py) reads the prefix data and hands it
to the model; the shell reads the SLO verdict, the predictions and the per-endpoint view through this face.
"""

from scheduling.latency.backlog import SharedBacklog
from scheduling.latency.classes import LOOSE, TIGHT, Placement, SloClasses, place
from scheduling.latency.config import ModelConfig, output_tokens
from scheduling.latency.estimates import Timings
from scheduling.latency.estimator import EndpointModel, LatencyModel, ScoredPass
from scheduling.latency.fit import EndpointFit, FitView
from scheduling.latency.hold import TightWork, busy, hold_budget, is_tight
from scheduling.latency.learner import Chosen, Learner
from scheduling.latency.outside import OutsideLoad
from scheduling.latency.slo import MAX_SLO_MS, SLO_STATE, Slo, SloVerdict, decision_slo, slo_from_headers
from scheduling.latency.table import EngineTimingTable
from scheduling.latency.tiers import PREDICTED, TIGHT_PLACEMENT, predictions, relative, slo_scores
from scheduling.latency.trust import APPROXIMATE, DEGRADED, EXACT, TrustTable, TrustView

__all__ = [
    "APPROXIMATE",
    "DEGRADED",
    "EXACT",
    "LOOSE",
    "MAX_SLO_MS",
    "PREDICTED",
    "SLO_STATE",
    "TIGHT",
    "TIGHT_PLACEMENT",
    "Chosen",
    "EndpointFit",
    "EndpointModel",
    "EngineTimingTable",
    "FitView",
    "LatencyModel",
    "Learner",
    "ModelConfig",
    "OutsideLoad",
    "Placement",
    "ScoredPass",
    "SharedBacklog",
    "Slo",
    "SloClasses",
    "SloVerdict",
    "Timings",
    "TrustTable",
    "TightWork",
    "TrustView",
    "busy",
    "decision_slo",
    "hold_budget",
    "is_tight",
    "output_tokens",
    "place",
    "predictions",
    "relative",
    "slo_from_headers",
    "slo_scores",
]
