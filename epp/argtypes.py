"""argparse value types shared by every command line (`epp serve`, `epp stack` and the flag groups they add)."""

from __future__ import annotations

import argparse


def parse_bool(text: str) -> bool:
    """true/false, yes/no, on/off or 1/0."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_duration_arg(text: str) -> float:
    """'50ms', '2s', '1m' or a plain number of seconds."""
    from scheduling.framework.params import parse_duration

    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 50ms or 2s, got {text!r}") from None
