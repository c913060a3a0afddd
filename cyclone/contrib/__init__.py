"""Integrations with frameworks and tools; each module needs its own optional extra."""
