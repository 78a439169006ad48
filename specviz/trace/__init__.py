"""Traces: plain data describing one decoding run, round by round (no tensors, no models).

model.py     the dataclasses (Trace, Round, Position, ...) and what a trace's JSON holds
tree.py      a tree round's token tree (Round.tree) and the checks of its shape
schema.py    the pydantic schema every loaded trace must satisfy before a view draws it
recording.py reading and writing traces and recordings (a race's two traces in one file)

Imports go one way: recording -> schema -> model -> summary, tree.  This package re-exports the public names.
"""

from .model import (DRAFT_STOPS, SCHEMA_VERSION, RUN_ENDS, DraftToken, Extra, Picture, Position, Round, Token, Trace,
                    TraceError)
from .recording import (MAX_TRACE_BYTES, load_recording, recording_bytes, recording_to_json, save_recording,
                        trace_from_dict, trace_from_json)
from .summary import Summary, theoretical_speedup
from .tree import RoundTree

__all__ = ["DRAFT_STOPS", "MAX_TRACE_BYTES", "SCHEMA_VERSION", "RUN_ENDS", "DraftToken", "Extra", "Picture", "Position",
           "Round", "RoundTree", "Token", "Trace", "TraceError", "load_recording", "recording_bytes",
           "recording_to_json", "save_recording", "theoretical_speedup", "trace_from_dict", "trace_from_json"]
