"""Producer plugins (the one writer of each piece of shared data): one per module, discovered by the registry."""
