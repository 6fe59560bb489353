"""destination-endpoint-served-verifier (the GIE conformance suite's `conformance-plugins.yaml`):

    response header x-conformance-test-served-endpoint = the gateway's x-gateway-destination-endpoint-served
                                                          response metadata (the endpoint it reports it served)

The request path does the echo (epp/request/respond.py); this plugin only turns it on. Like the
header-based-testing-filter it exists for the conformance suite only, and Pointsman logs a warning when a config
declares it.
"""

from __future__ import annotations

from scheduling.framework import System, register

VERIFIER_TYPE = "destination-endpoint-served-verifier"


@register(VERIFIER_TYPE)
class DestinationEndpointServedVerifier(System[None]):
    Params = None
