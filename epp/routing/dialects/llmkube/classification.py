"""LLMKube's data classification: what a request says it carries, and the guard that keeps sensitive data local.

Mode `header-only` (the only one LLMKube implements): the classification is the value of the header named by
`policy.classification.headerKey` (x-llmkube-classification by default); the body is never classified. A request
without the header carries no classification and matches no `dataClassification` rule.

Reading the header is made robust against whatever a client sends, because a sensitive request must never be
mistaken for a harmless one:
- every value counts: "public, pii" carries both; a repeated header arrives joined with ',' (Envoy's ext_proc
  delivers each copy; Pointsman joins them), so two copies carry both values too;
- each value is compared normalized (epp.routing.dialects.llmkube.model.normalize_label): Unicode NFKC, case-folded,
  trimmed of blanks and quotes ("PII", " Pii ", "\"pii\"" and the full-width "ＰＩＩ" all read "pii");
- a sensitive word inside a decorated value counts too ("pii;source=crm", "pii data"): the guard errs on the side
  of keeping data local.
LLMKube's proxy reads only the first value of the header, lower-cased; Pointsman reads all of them, so a request
labelled sensitive anywhere in the header is treated as sensitive.

The guard (`sensitive`, used by epp/routing/dialects/llmkube/match.py): a request carrying any of
`sensitiveClassifications` (pii, phi by default) is served by local-tier backends only, whatever matched it (a
rule, BackendNameMatch, the default route). Where only cloud backends would serve it, it is refused with a 503;
it is never sent out of the cluster. The static half lives in the dialect (epp/routing/dialects/llmkube/documents.py): a rule that
matches a sensitive classification must be failClosed and list local backends only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from epp.routing.dialects.llmkube.model import COMPLEXITY_HEADER, Features, normalize_label

MAX_VALUES = 32  # a header with more values than this is read for its first 32 and the sensitive ones
_WORDS = re.compile(r"[;\s|/=]+")


def classifications(headers: Mapping[str, str], header_key: str, sensitive: Iterable[str] = ()) -> frozenset[str]:
    """Every classification the request carries, normalized. A comma-separated value is one classification; a
    sensitive word inside a value ("pii;source=crm", "pii data") counts too, so decoration cannot hide it. Values
    past MAX_VALUES are kept only when they are sensitive, so a long header can neither hide a sensitive value nor
    make the set large."""
    raw = headers.get(header_key, "")
    if not raw:
        return frozenset()
    keep = frozenset(sensitive)
    out: set[str] = set()
    for i, part in enumerate(raw.split(",")):
        value = normalize_label(part)
        if not value:
            continue
        if i < MAX_VALUES or value in keep:
            out.add(value)
        if keep:
            out.update(w for w in (normalize_label(x) for x in _WORDS.split(value)) if w in keep)
    return frozenset(out)


def features(headers: Mapping[str, str], model: str, header_key: str, sensitive: Iterable[str] = ()) -> Features:
    """The request as LLMKube's rules see it."""
    return Features(
        model=model,
        classifications=classifications(headers, header_key, sensitive),
        complexity=normalize_label(headers.get(COMPLEXITY_HEADER, "")),
        headers=headers,
    )


def sensitive(f: Features, sensitive_set: frozenset[str]) -> frozenset[str]:
    """The sensitive classifications the request carries (empty: not sensitive)."""
    return f.classifications & sensitive_set
