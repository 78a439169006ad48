"""`python -m specviz.export RECORDING -o page.html`: the command's entry point (specviz.cli.export)."""

from __future__ import annotations

import sys

from specviz.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
