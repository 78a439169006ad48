"""Experiments on a loaded pair, beyond one run: sweeps, the drafter shoot-out, their recordings; and the
workshop's challenges, checked over a learner's runs.

sweeps.py            γ and ε sweeps, tree verify times
shootout.py          every drafter, then standard decoding, on one prompt
recorded.py          the recorded sweeps shown at page load (assets/sweeps.json, checked with pydantic)
challenges.py        the guided challenges (texts, order) and check_all
challenge_checks.py  their checks (pure: traces in, verdicts out)
challenge_runs.py    a learner's run, a verdict, and the readings the checks share
"""
