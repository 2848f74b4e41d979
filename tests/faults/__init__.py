"""Fault injection: a database outage, a Temporal server restart and killed workers."""
