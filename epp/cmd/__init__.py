"""epp/cmd."""
