"""Reads: what users may see of APIs, jobs, calls and limiter state (services do the writes)."""
