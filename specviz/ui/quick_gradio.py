"""Importing Gradio without rewriting its type stubs: 2 s off every start (issue 34's warm start).

Gradio (6.x) regenerates its components' ``.pyi`` stubs at every import.  Each component class's metaclass
(``gradio.component_meta.ComponentMeta``) calls ``create_or_modify_pyi``, which reads the class's source
file, parses it with :mod:`ast` (twice: the source and the stub), renders a jinja template and compares the
result with the ``.pyi`` beside it, writing it back where it differs.  Eighty-one classes: 2.1 of the
5.0 s that ``import gradio`` takes on the 2-core AVX2 EPYC (4.97 -> 2.88 s, measured 2026-11-26), all of it
pure Python under the one interpreter lock the model preload shares (:mod:`specviz.serving.preload`).
The stubs are for editors working on Gradio's own code; a server never reads them, and a read-only
install cannot take them anyway.

:func:`install` turns that step off for this process: a one-shot import hook replaces
``create_or_modify_pyi`` with a no-op as soon as ``gradio.component_meta`` has run, before the first
component class is made.  Everything else the metaclass does (the event listeners, ``updateable``) is
untouched.  A Gradio that no longer has the function is left as it is.

Pinned: the hook is installed only for the Gradio version it was tested on (``TESTED``, the version
requirements.txt names; tests/test_quick_gradio.py checks both the saving and the pin).  Another version imports
as Gradio ships it: 2 s slower, never broken.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

MODULE = "gradio.component_meta"
TESTED = "6.31.0"
HOOK_NAME = "create_or_modify_pyi"


def _skip(*_args: Any, **_kwargs: Any) -> None:
    """The stub writer, switched off (see the module's docstring)."""


def _patch(module: Any) -> bool:
    if callable(getattr(module, HOOK_NAME, None)):
        setattr(module, HOOK_NAME, _skip)
        return True
    return False


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``gradio.component_meta`` as the path finder does, then patches it once it has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != MODULE:
            return None
        uninstall()  # one shot: this very import is the only one to watch
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance, made for this import
        return spec


def install() -> bool:
    """Skip Gradio's stub rewriting in this process.  Call it before ``import gradio``; called after,
    it still spares any component class made later.  True when the skip is in place or will be; False for
    a Gradio other than the tested one (left as it is)."""
    if _installed_version() != TESTED:
        return False
    if MODULE in sys.modules:
        return _patch(sys.modules[MODULE])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


def _installed_version() -> str:
    """The installed Gradio's version, read from its metadata (without importing it)."""
    from importlib import metadata

    try:
        return metadata.version("gradio")
    except metadata.PackageNotFoundError:
        return ""


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
