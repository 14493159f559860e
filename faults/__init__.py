"""The fault suite (`make chaos`, run by .ci/run): ratejobs with real processes, one part broken
at a time (faults/chaos.py)."""
