"""epp/request."""
