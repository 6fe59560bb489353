"""The registered routing dialects (epp/routing/dialect.py says what each declares). A new dialect: its folder here
and one entry below."""

from epp.routing.dialect import Dialect
from epp.routing.dialects.kthena import DIALECT as KTHENA
from epp.routing.dialects.llmkube import DIALECT as LLMKUBE

DIALECTS: tuple[Dialect, ...] = (KTHENA, LLMKUBE)
BY_GROUP: dict[str, Dialect] = {d.group: d for d in DIALECTS}
BY_NAME: dict[str, Dialect] = {d.name: d for d in DIALECTS}

__all__ = ["BY_GROUP", "BY_NAME", "DIALECTS"]
