"""The filter -> score -> pick framework."""

from scheduling.framework.errors import ConfigError
from scheduling.framework.plugin import (
    BuildContext,
    Filter,
    FilterScorer,
    Picker,
    Plugin,
    Producer,
    ProfileHandler,
    Scorer,
    State,
    System,
)
from scheduling.framework.profile import Profile, Timer
from scheduling.framework.registry import (
    create,
    create_filter,
    create_handler,
    create_picker,
    create_scorer,
    register,
)
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
    "Producer",
    "Scorer",
    "State",
    "System",
    "Timer",
    "create",
    "create_filter",
    "create_handler",
    "create_picker",
    "create_scorer",
    "register",
]
