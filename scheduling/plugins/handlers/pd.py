"""pd-profile-handler (Heimdall: pd; llm-d: disagg): prefill/decode disaggregation.

1. Run the decode profile (it filters to decode-role endpoints). Nothing picked -> the request fails, unless
   no candidate has a decode role while some have a prefill role: then the prefill profile's pick serves the
   request end-to-end (decision "decode-only").
2. Decide whether to prefill elsewhere:
       decider "prefix": input = estimated prompt tokens (characters / CHARS_PER_TOKEN); cached = matched_blocks(decode pick) × blockSizeTokens
                         disaggregate iff nonCachedTokens > 0 and input − cached ≥ nonCachedTokens (0 = never)
       decider "always" / "never": as named (Heimdall pd uses "always")
3. Disaggregating: run the prefill profile (optionally only over endpoints sharing the decode pick's
   pdGroupLabel value, Kthena pairing). No prefill pick, or the same endpoint as decode -> "decode-only".
   result.targets = decode pick; result.prefill = prefill pick; result.decision = "prefill-decode".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, ConfigError, ProfileHandler, register
from scheduling.framework.data import DataRequest
from scheduling.framework.params import bounded
from scheduling.framework.plugin import RunProfile, State
from scheduling.plugins.filters._roles import is_decode, is_prefill
from scheduling.prefix import PrefixReader
from scheduling.types import Endpoint, ErrorCode, SchedulingError

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"


@dataclass(frozen=True)
class Params:
    decodeProfile: str = "decode"
    prefillProfile: str = "prefill"
    decider: Literal["prefix", "always", "never"] = "prefix"
    nonCachedTokens: int = bounded(0, min=0)
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)
    pdGroupLabel: str = ""


@register("pd-profile-handler")
class PdProfileHandler(PrefixReader[Params], ProfileHandler[Params]):
    Params = Params

    def data_requests(self) -> Sequence[DataRequest]:
        p = self.params
        if p.decider != "prefix" or p.nonCachedTokens <= 0:
            return ()  # the decider never looks at the prefix data
        return super().data_requests()

    def validate_profiles(self, profiles: Sequence[str], build: BuildContext) -> None:
        for want in (self.params.decodeProfile, self.params.prefillProfile):
            if want not in profiles:
                raise ConfigError(
                    build.source,
                    build.path,
                    f"pd-profile-handler needs a profile named {want!r}; configured: {', '.join(profiles) or '(none)'}",
                )

    def disaggregate(self, ctx: SchedulingContext, decode_key: str, state: State) -> bool:
        p = self.params
        if p.decider == "always":
            return True
        if p.decider == "never" or p.nonCachedTokens <= 0:
            return False
        matches, _ = self.prefix.matches(ctx, state)
        cached = matches.get(decode_key, 0) * p.blockSizeTokens
        return bool(ctx.request.estimated_tokens - cached >= p.nonCachedTokens)

    def handle(
        self,
        ctx: SchedulingContext,
        candidates: list[Endpoint],
        profiles: Sequence[str],
        run: RunProfile,
        state: State,
    ) -> SchedulingResult:
        p = self.params
        try:
            decode = run(p.decodeProfile, candidates)
        except SchedulingError as err:
            if err.code is not ErrorCode.RESOURCE_EXHAUSTED or any(is_decode(e) for e in candidates):
                raise
            if not any(is_prefill(e) for e in candidates):
                raise
            only = run(p.prefillProfile, candidates)  # one role only: serve end-to-end there
            return SchedulingResult(
                targets=only.targets, profile_results={p.prefillProfile: only}, decision=DECODE_ONLY
            )
        result = SchedulingResult(targets=decode.targets, profile_results={p.decodeProfile: decode})
        primary = decode.targets[0]
        if not self.disaggregate(ctx, primary.key, state):
            result.decision = DECODE_ONLY
            return result
        pool = candidates
        if p.pdGroupLabel:
            group = primary.labels.get(p.pdGroupLabel)
            pool = [e for e in candidates if e.labels.get(p.pdGroupLabel) == group]
        if not any(is_prefill(e) and e.key != primary.key for e in pool):
            result.decision = DECODE_ONLY
            return result
        try:
            prefill = run(p.prefillProfile, pool)
        except SchedulingError as err:
            if err.code is not ErrorCode.RESOURCE_EXHAUSTED:
                raise
            result.decision = DECODE_ONLY
            return result
        result.profile_results[p.prefillProfile] = prefill
        if prefill.targets[0].key == primary.key:
            result.decision = DECODE_ONLY
            return result
        result.prefill = prefill.targets[0]
        result.decision = PREFILL_DECODE
        return result
