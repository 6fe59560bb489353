"""epp/extproc."""
