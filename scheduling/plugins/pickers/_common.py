"""Parameters shared by the pickers."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.framework.params import bounded


@dataclass(frozen=True)
class PickerParams:
    maxNumOfEndpoints: int = bounded(1, min=1)
