"""What a routing dialect declares: the interface every `epp/routing/dialects/<name>/` folder fills in.

A dialect is one project's routing documents (Kthena's ModelRoute / ModelServer / ExternalModelProvider, LLMKube's
ModelRouter). It declares:

- `group` and `resources`: its documents' apiVersion group, and the Kubernetes kinds `--watch-routes` lists and
  watches (the RBAC in deploy/ grants exactly these, see epp/fleet/k8s);
- `compile(obj, where, position)`: one document to its compiled objects. Objects of the shared route model
  (epp/routing/model.py: Route, PoolBackend, ProviderBackend) join the routing table's routes and backends, so the
  shared router, matcher, pools, sticky sessions, providers and Envoy fragments serve them with no dialect code;
  any other object is the dialect's own and is kept under its name (`RoutingTable.objects(name)`);
- `identity(obj)`: (kind, namespace, name), for last-good-version bookkeeping (the Kubernetes default fits most);
- `runtime` (optional): a factory of the run-time part the router consults for a model no route names
  (LLMKube's ModelRouter: its own rules, balancing and quarantine). A runtime is also a request observer
  (epp/request/observe.py) of the requests it routed;
- `envoy` (optional): Envoy fragments its objects need beyond the shared ones (clusters, routes made from the pool
  routes, retries, a stream idle timeout), added by `epp envoy-config --routes-file`;
- `example` (optional): `epp stack --example <name>`: route documents over the simulated servers, and what to try.

The registry is epp/routing/dialects/__init__.py. A third dialect is one folder (documents.py compiling onto the
shared model, an __init__ declaring `DIALECT`), one line in the registry, and a docs page.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from epp.fleet.k8s import Resource
from epp.routing.validate import identity as k8s_identity

if TYPE_CHECKING:
    from epp.routing.decision import RouteDecision
    from epp.routing.router import Router
    from scheduling.api import SchedulingResult

Identity = tuple[str, str, str]  # (kind, namespace, name)
Compile = Callable[[object, str, float], object]  # -> a compiled object, or a sequence of them


class RoutedRequest(Protocol):
    """What a runtime reads of a request it routed (epp/request's exchange): the context the pick was made in
    (its `route` is the decision) and the scheduler's result (None for an external provider)."""

    @property
    def ctx(self) -> object: ...
    @property
    def result(self) -> SchedulingResult | None: ...


class ResponseFollow(Protocol):
    """A runtime's follow of a routed request's response path (epp/request/observe.py's Follow); it reads neither
    the exchange nor the usage."""

    def response_headers(self, ex: object, status: int, served: str | None) -> None: ...
    def response_chunk(self, ex: object, size: int, end_of_stream: bool) -> None: ...
    def closed(self, ex: object, usage: object) -> None: ...


class DialectRuntime(Protocol):
    """The run-time part of a dialect, made once per Router (see `Dialect.runtime`)."""

    name: str
    reserved_headers: tuple[str, ...]  # request headers only Pointsman sets for it: removed from every request

    def apply(self, objects: tuple[Any, ...]) -> None:
        """The dialect's objects of the new routing table (oldest first)."""
        ...

    def active(self) -> bool:
        """True when it routes: a model no route names is its to decide."""
        ...

    def decide(self, headers: Mapping[str, str], model: str, *, now: float, rng: random.Random,
               metadata: Mapping[str, Mapping[str, object]], body: Mapping[str, object] | None) -> RouteDecision: ...

    def endpoint_removed(self, key: str) -> None: ...

    # A request observer (epp/request/observe.py) of the requests it routed.
    def decided(self, ex: RoutedRequest) -> ResponseFollow | None: ...
    def rejected(self, ex: object, code: str) -> None: ...


class RuntimeFactory(Protocol):
    """`Dialect.runtime`: the dialect's runtime for a Router (`gateway_headers`: the headers naming the served model
    to the gateway's routes)."""

    def __call__(self, router: Router, *, gateway_headers: Sequence[str]) -> DialectRuntime: ...


@dataclass
class EnvoyFragments:
    """What a dialect adds to the Envoy bootstrap (plain dicts; epp/envoy_config/providers.py applies them)."""

    clusters: list[dict[str, Any]] = field(default_factory=list)
    max_retries: int = 0  # retries on the pool routes (the most any request may need)
    idle_timeout_s: float | None = None  # the pool routes' stream idle timeout (0: off; None: Envoy's default)
    # Routes put ahead of the pool routes, made from them (e.g. one mirroring copy per shadow count).
    extra_routes: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]] | None = None


@dataclass(frozen=True)
class StackExample:
    """`epp stack --example <name>`: what the local stack runs for a dialect."""

    help: str
    describe: Callable[[], str]  # the progress line: where the routes are and what they do
    routes: Callable[[list[int], str], str]  # (server ports, the servers' model) -> route documents (YAML)
    # (server ports, how the stack writes one server) -> the endpoints file's pools; None: the routes carry them
    pools: Callable[[list[int], Callable[[int], dict[str, Any]]], list[dict[str, Any]]] | None
    ready: Callable[[str, int, int, str, str], str]  # (url, gRPC port, metrics port, epp binary, model) -> to try


@dataclass(frozen=True)
class Dialect:
    name: str
    group: str
    resources: tuple[Resource, ...]
    compile: Compile
    identity: Callable[[Mapping[str, object]], Identity | None] = k8s_identity
    runtime: RuntimeFactory | None = None  # runtime(router, gateway_headers=...) -> DialectRuntime
    envoy: Callable[[tuple[Any, ...]], EnvoyFragments] | None = None  # its objects -> fragments
    example: StackExample | None = None
    page: str = ""  # its docs page


def make_runtimes(dialects: Sequence[Dialect], router: Router, *, gateway_headers: Sequence[str]
                  ) -> list[DialectRuntime]:
    return [d.runtime(router, gateway_headers=gateway_headers) for d in dialects if d.runtime is not None]
