"""Experiments on a loaded pair, beyond one run: sweeps, the drafter shoot-out, their recordings.

sweeps.py    γ and ε sweeps, tree verify times
shootout.py  every drafter, then standard decoding, on one prompt
recorded.py  the recorded sweeps shown at page load (assets/sweeps.json, checked with pydantic)
"""
