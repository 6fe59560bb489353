"""epp/fleet."""
