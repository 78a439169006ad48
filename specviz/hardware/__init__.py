"""The machine a run executes on: its probe, which chooses how the target executes, and what
runs cost there (see probe.py).

Importing this package installs the probe as the models' execution chooser (choose.py): from then on
``specviz.models.load_pair(target_exec="auto")`` runs the target as the probe chooses.
"""

from .choose import install as _install

_install()
