"""header-based-testing-filter (the GIE conformance suite's `conformance-plugins.yaml`):

    kept = {e in candidates : e.address in named IPs  or  (e.address, e.port) in named IP:port pairs}
    named = the request's `test-epp-endpoint-selection` header, a comma list of IPs (every port of that address)
            or IP:port pairs ([v6]:port for IPv6); without the header kept = candidates

A header that names none of the candidates leaves none (the request gets a 503). It exists for the conformance
suite only: a config that declares it lets a client choose its own endpoint, so Pointsman logs a warning when it
loads one (docs/deploy.md, "Conformance").
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint

SELECTION_HEADER = "test-epp-endpoint-selection"
FILTER_TYPE = "header-based-testing-filter"


def named_endpoints(value: str) -> tuple[frozenset[str], frozenset[tuple[str, int]]]:
    """'10.0.0.1, 10.0.0.2:8000, [fd00::1]:8000' -> ({addresses named alone}, {(address, port) pairs})."""
    ips: set[str] = set()
    pairs: set[tuple[str, int]] = set()
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        if entry.startswith("["):
            close = entry.find("]")
            ip, rest = entry[1:close], entry[close + 1:]
            port = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:
            ip, port = entry.split(":", 1)
        else:
            ip, port = entry, ""  # a bare IPv4 or IPv6 address
        if port.isdigit():
            pairs.add((ip, int(port)))
        else:
            ips.add(ip)
    return frozenset(ips), frozenset(pairs)


@register(FILTER_TYPE)
class HeaderBasedTestingFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        value = ctx.request.headers.get(SELECTION_HEADER)
        if value is None:
            return candidates
        ips, pairs = named_endpoints(value)
        return [e for e in candidates if e.address in ips or (e.address, e.port) in pairs]
