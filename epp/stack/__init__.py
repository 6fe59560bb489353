"""epp/stack."""
