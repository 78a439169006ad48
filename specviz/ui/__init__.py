"""The Gradio side of specviz, apart from the layout (app.py).

- ``form.py``: `RunForm`, the typed form that Run, the sweeps and the API send.
- ``frames.py``: the typed frames handlers return, and `Slots`, which maps
  their fields to components (``{component: value}`` for Gradio).
- ``live.py``: the Live tab (Run, Stop, replay, recordings, step mode).
- ``tabs.py``: the Theory and Sweeps tabs and the drafting controls.
- ``api.py``: the ``/trace`` endpoint.
"""
