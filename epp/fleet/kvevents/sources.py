"""Where each endpoint publishes its KV events. Pure: no I/O.

Three sources, first match wins:

1. **The endpoints file**: an optional ``kvEvents`` field per endpoint, a string (the PUB endpoint) or a
   mapping::

       kvEvents: {endpoint: "tcp://10.0.0.5:5557", replay: "tcp://10.0.0.5:5558", topic: "kv@", dataParallelSize: 1}

   It is validated when the file loads and carried on the Endpoint as the annotations below.
2. **Pod annotations** (Kubernetes): ``pointsman.ai/kv-events-endpoint`` (required), and optionally
   ``pointsman.ai/kv-events-replay-endpoint``, ``pointsman.ai/kv-events-topic``,
   ``pointsman.ai/kv-events-dp-size``. An endpoint value is ``tcp://host:port``, or a bare port (the pod's IP is
   filled in); ``{ip}``, ``{port}`` and ``{model}`` placeholders are expanded (``{port}`` is the endpoint's
   serving port, ``{model}`` its model when it serves exactly one).
3. **The port template** (command line): ``--kv-events-port 5557`` subscribes to ``tcp://<endpoint ip>:5557``
   for every endpoint without an explicit source; ``--kv-events-replay-port``, ``--kv-events-topic`` (a template,
   e.g. ``kv@{ip}:{port}@{model}`` as llm-d names topics) and ``--kv-events-dp-size`` complete it.

Topics are ZMQ prefix filters. An empty topic receives everything the publisher sends (vLLM's default topic is
empty); a template whose ``{model}`` cannot be filled is cut just before it, so it still matches as a prefix.

With data parallelism (`data_parallel_size` > 1), rank r publishes on the endpoint's port + r and replays on the
replay port + r, as vLLM and SGLang bind them.

Public API: `KVEventsSource`, `KVEventsTemplate`, `source_for(endpoint, template)`, `parse_kv_events_field`
(endpoints file → annotations), `dp_size` (a data-parallel size checked), the annotation names,
`KVEventsConfigError`; the command line's template is
`epp.fleet.kvevents.settings.KVEventsSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduling.types import Endpoint

ANNOTATION_ENDPOINT = "pointsman.ai/kv-events-endpoint"
ANNOTATION_REPLAY = "pointsman.ai/kv-events-replay-endpoint"
ANNOTATION_TOPIC = "pointsman.ai/kv-events-topic"
ANNOTATION_DP_SIZE = "pointsman.ai/kv-events-dp-size"
ANNOTATIONS = (ANNOTATION_ENDPOINT, ANNOTATION_REPLAY, ANNOTATION_TOPIC, ANNOTATION_DP_SIZE)
MAX_DP_SIZE = 64


class KVEventsConfigError(ValueError):
    pass


def offset_port(address: str, rank: int) -> str:
    """``tcp://host:port`` with the port moved up by `rank` (vLLM's data-parallel rule)."""
    if rank == 0:
        return address
    base, _, port = address.rpartition(":")
    return f"{base}:{int(port) + rank}"


@dataclass(frozen=True, slots=True)
class KVEventsSource:
    endpoint: str  # the rank-0 PUB address, tcp://host:port
    replay: str | None = None  # the rank-0 replay ROUTER address
    topic: str = ""  # subscription prefix
    data_parallel_size: int = 1

    def rank_endpoint(self, rank: int) -> str:
        return offset_port(self.endpoint, rank)

    def rank_replay(self, rank: int) -> str | None:
        return None if self.replay is None else offset_port(self.replay, rank)


@dataclass(frozen=True, slots=True)
class KVEventsTemplate:
    port: int | None = None
    replay_port: int | None = None
    topic: str = ""
    data_parallel_size: int = 1


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip


def _expand(value: str, endpoint: Endpoint, what: str) -> str:
    model = next(iter(endpoint.models)) if len(endpoint.models) == 1 else None
    out = value.replace("{ip}", _host(endpoint.address)).replace("{port}", str(endpoint.port))
    if "{model}" in out:
        out = out.replace("{model}", model) if model is not None else out[: out.index("{model}")]
    if "{" in out or "}" in out:
        raise KVEventsConfigError(f"{what}: unknown placeholder in {value!r}; use {{ip}}, {{port}} or {{model}}")
    return out


def _address(value: str, endpoint: Endpoint, what: str) -> str:
    value = value.strip()
    if value.isdigit():
        value = f"tcp://{{ip}}:{value}"
    out = _expand(value, endpoint, what)
    if not out.startswith("tcp://"):
        raise KVEventsConfigError(f"{what}: expected tcp://host:port or a port number, got {value!r}")
    host, _, port = out[len("tcp://"):].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise KVEventsConfigError(f"{what}: expected tcp://host:port with a port 1-65535, got {value!r}")
    return out


def parse_dp_size(value: object, what: str) -> int:
    """A data-parallel size (1..MAX_DP_SIZE) from `value`; KVEventsConfigError naming `what` otherwise."""
    try:
        n = int(str(value).strip())
    except ValueError:
        raise KVEventsConfigError(f"{what}: expected an integer 1-{MAX_DP_SIZE}, got {value!r}") from None
    if not 1 <= n <= MAX_DP_SIZE:
        raise KVEventsConfigError(f"{what}: expected an integer 1-{MAX_DP_SIZE}, got {value!r}")
    return n


def source_from_annotations(endpoint: Endpoint, annotations: Mapping[str, str]) -> KVEventsSource | None:
    """The source named by an endpoint's annotations, or None. Raises KVEventsConfigError naming the field."""
    ep = annotations.get(ANNOTATION_ENDPOINT)
    if not ep:
        return None
    where = endpoint.name or endpoint.key
    replay = annotations.get(ANNOTATION_REPLAY)
    return KVEventsSource(
        endpoint=_address(ep, endpoint, f"{where}: {ANNOTATION_ENDPOINT}"),
        replay=_address(replay, endpoint, f"{where}: {ANNOTATION_REPLAY}") if replay else None,
        topic=_expand(annotations.get(ANNOTATION_TOPIC, ""), endpoint, f"{where}: {ANNOTATION_TOPIC}"),
        data_parallel_size=parse_dp_size(annotations.get(ANNOTATION_DP_SIZE, 1), f"{where}: {ANNOTATION_DP_SIZE}"),
    )


def source_from_template(endpoint: Endpoint, template: KVEventsTemplate) -> KVEventsSource | None:
    if template.port is None:
        return None
    host = _host(endpoint.address)
    return KVEventsSource(
        endpoint=f"tcp://{host}:{template.port}",
        replay=f"tcp://{host}:{template.replay_port}" if template.replay_port is not None else None,
        topic=_expand(template.topic, endpoint, "--kv-events-topic"),
        data_parallel_size=template.data_parallel_size,
    )


def source_for(endpoint: Endpoint, template: KVEventsTemplate | None = None) -> KVEventsSource | None:
    """The endpoint's own source (endpoints file or pod annotations), else the template's, else None."""
    own = source_from_annotations(endpoint, endpoint.annotations)
    if own is not None:
        return own
    return source_from_template(endpoint, template) if template is not None else None


def parse_kv_events_field(raw: object, path: str) -> dict[str, str]:
    """The endpoints file's ``kvEvents`` value → the equivalent annotations. Raises KVEventsConfigError."""
    if isinstance(raw, str):
        raw = {"endpoint": raw}
    if not isinstance(raw, Mapping):
        raise KVEventsConfigError(f"{path}: expected tcp://host:port or a mapping with 'endpoint'")
    known = {"endpoint", "replay", "topic", "dataParallelSize"}
    unknown = set(raw) - known
    if unknown:
        raise KVEventsConfigError(f"{path}: unknown field(s) {sorted(unknown)}; expected some of {sorted(known)}")
    out = {}
    for field, ann in (("endpoint", ANNOTATION_ENDPOINT), ("replay", ANNOTATION_REPLAY),
                       ("topic", ANNOTATION_TOPIC)):
        value = raw.get(field)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and field != "topic":
            value = str(value)
        if not isinstance(value, str):
            raise KVEventsConfigError(f"{path}.{field}: expected a string, got {value!r}")
        out[ann] = value
    if ANNOTATION_ENDPOINT not in out:
        raise KVEventsConfigError(f"{path}.endpoint: required (tcp://host:port or a port number)")
    if "dataParallelSize" in raw:
        out[ANNOTATION_DP_SIZE] = str(parse_dp_size(raw["dataParallelSize"], f"{path}.dataParallelSize"))
    probe = Endpoint(key="0.0.0.0:1", address="0.0.0.0", port=1)  # syntax check; placeholders stay valid
    _address(out[ANNOTATION_ENDPOINT], probe, f"{path}.endpoint")
    if ANNOTATION_REPLAY in out:
        _address(out[ANNOTATION_REPLAY], probe, f"{path}.replay")
    _expand(out.get(ANNOTATION_TOPIC, ""), probe, f"{path}.topic")
    return out
