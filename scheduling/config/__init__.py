"""Scheduling configuration: EndpointPickerConfig, Heimdall SchedulingProfile and model bindings.

Entry point: `load_scheduler(source, *, rng, timer=None) -> ModelScheduler`.
"""

from scheduling.config.loader import load_scheduler, parse_yaml, read_documents
from scheduling.framework.errors import ConfigError
from scheduling.framework.model_scheduler import ModelScheduler

__all__ = ["ConfigError", "ModelScheduler", "load_scheduler", "parse_yaml", "read_documents"]
