"""Integrations with web frameworks, each installed through its own optional extra."""
