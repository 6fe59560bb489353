"""epp/api."""
