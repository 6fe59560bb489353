"""The `epp` command (cli.py) and `epp serve`'s wiring: its settings (settings.py), its components
(components.py) and the order they start in (app.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.cmd.app import App
    from epp.cmd.cli import main
    from epp.cmd.components import Components
    from epp.cmd.settings import ServeSettings

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): `epp
# endpoints` loads neither `epp serve`'s flags nor its components.
_LAZY = {
    "App": "app",
    "main": "cli",
    "Components": "components",
    "ServeSettings": "settings",
}

__all__ = ["App", "Components", "ServeSettings", "main"]


__getattr__ = lazy_exports(__name__, _LAZY)
