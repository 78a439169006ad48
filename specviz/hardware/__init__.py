"""The machine a run executes on: its probe, its executions and what they cost (see probe.py)."""
