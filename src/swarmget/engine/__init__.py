"""Scheduling jobs onto pooled connections, with retry and deadline policy."""
