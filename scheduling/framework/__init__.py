"""The filter -> score -> pick framework."""

from scheduling.framework.errors import ConfigError
from scheduling.framework.plugin import (
    BuildContext,
    Filter,
    FilterScorer,
    Picker,
    Plugin,
    ProfileHandler,
    Scorer,
    State,
)
from scheduling.framework.profile import Profile, Timer
from scheduling.framework.registry import create, register
from scheduling.framework.scheduler import ProfileScheduler

__all__ = [
    "BuildContext",
    "ConfigError",
    "Filter",
    "FilterScorer",
    "Picker",
    "Plugin",
    "Profile",
    "ProfileHandler",
    "ProfileScheduler",
    "Scorer",
    "State",
    "Timer",
    "create",
    "register",
]
