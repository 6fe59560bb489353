"""System plugins (they configure the shell, not a profile): one per module, discovered by the registry."""
