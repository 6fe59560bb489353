"""Metrics scraping: the scraper (scraper.py) polls each endpoint's Prometheus page and the parser (parser.py)
reads the engines' metrics into the datastore."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.fleet.scrape.scraper import MetricsScraper, start_scraper

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): nothing
# loads aiohttp before the scraper starts.
_LAZY = {
    "MetricsScraper": "scraper", "start_scraper": "scraper",
}

__all__ = ["MetricsScraper", "start_scraper"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
