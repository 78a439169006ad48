"""Jobs behind the UI and the API, with no Gradio in them.

jobs.py          one run from a click or an API call: checked once, claimed, gated, decoded
service.py       input checks, the model lock, the race (speculative and standard, interleaved)
replay.py        finished runs served again from a bounded cache; the live gate (LiveGate)
sweep_budget.py  a sweep's wall-time limit (any sweep or shoot-out)
hosting.py       where the server runs (port, Hugging Face Spaces)
envvars.py       the SPECVIZ_* numbers from the environment (an unreadable one: the default, with a warning)
stream_log.py    a client's Gradio event stream ending early: one warning line, not Gradio's traceback
"""
