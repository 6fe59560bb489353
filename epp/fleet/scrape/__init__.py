"""Metrics scraping: the scraper (scraper.py) polls each endpoint's Prometheus page and the parser (parser.py)
reads the engines' metrics into the datastore."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.fleet.scrape.scraper import MetricsScraper, start_scraper

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): a command
# that never scrapes never loads the scraper.
_LAZY = {
    "MetricsScraper": "scraper", "start_scraper": "scraper",
}

__all__ = ["MetricsScraper", "start_scraper"]


__getattr__ = lazy_exports(__name__, _LAZY)
