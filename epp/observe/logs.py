"""Log output: `--log-format text` (the default) or `json`, one object per line.

Lines about a request (decision lines with `--log-decisions`, failures of scheduling, hooks, observers and
streams) carry the request's `decision_id`, `trace_id` (its sampled trace's, else the client's `traceparent`) and
`request_id` as log-record fields (`RequestExchange.log_fields()`): JSON prints them as keys, text appends them in
brackets when a line's message does not already name them.

    {"ts": "2026-01-02T03:04:05.678Z", "level": "INFO", "logger": "epp.director", "msg": "decision ...",
     "decision_id": "3f9c2a-1b", "trace_id": "4bf92f35...", "request_id": "..."}
"""

from __future__ import annotations

import logging
import time

import orjson

from epp.observe.settings import LogSettings

FIELDS = ("decision_id", "trace_id", "request_id")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, "")
            if value:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return orjson.dumps(out).decode()


class TextFormatter(logging.Formatter):
    """The plain format, with the request's ids appended when the message does not carry them already."""

    def __init__(self) -> None:
        super().__init__(TEXT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        text = super().formatMessage(record)
        did = getattr(record, "decision_id", "")
        if did and did not in text:
            trace = getattr(record, "trace_id", "")
            text += f" [decision={did}" + (f" trace={trace}" if trace else "") + "]"
        return text


def configure(settings: LogSettings) -> None:
    """The root logger's handler and level (as logging.basicConfig, with the chosen formatter)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(settings.level)
