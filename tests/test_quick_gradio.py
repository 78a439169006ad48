"""Gradio imported without rewriting its type stubs (specviz.ui.quick_gradio; issue 34's warm start)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Counts the stub writer's source parsing (ast.get_source_segment, which only it calls during the import)
# and checks that the components still work: events, a page built and its config made.
PROBE = """
import ast, sys
calls = []
real = ast.get_source_segment
ast.get_source_segment = lambda *a, **k: calls.append(1) or real(*a, **k)
if sys.argv[1] == "skip":
    from specviz.ui import quick_gradio
    assert quick_gradio.install()
elif sys.argv[1] == "app":
    import app  # noqa: F401  (app.py installs it before its own import of gradio)
import gradio as gr
from gradio import component_meta
with gr.Blocks() as demo:
    box = gr.Textbox()
    button = gr.Button()
    button.click(lambda s: s.upper(), box, box)
    box.change(lambda s: s, box, box)
assert demo.get_config_file()["dependencies"]
print(len(calls), component_meta.create_or_modify_pyi.__module__)
"""


def _run(mode: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "SPECVIZ_PRELOAD": "0"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    calls, where = out.stdout.split()[-2:]
    return int(calls), where


def test_gradio_rewrites_its_stubs_at_import_unless_told_not_to():
    calls, where = _run("plain")
    assert calls >= 50 and where == "gradio.component_meta"  # what the hook exists to skip
    calls, where = _run("skip")
    assert calls == 0 and where == "specviz.ui.quick_gradio"


def test_the_app_imports_gradio_with_the_skip_in_place():
    calls, where = _run("app")
    assert calls == 0 and where == "specviz.ui.quick_gradio"


def test_install_after_the_import_patches_the_module_and_a_gradio_without_it_is_left_alone(monkeypatch):
    from types import ModuleType

    from specviz.ui import quick_gradio

    fake = ModuleType(quick_gradio.MODULE)
    fake.create_or_modify_pyi = lambda *a: 1 / 0
    monkeypatch.setitem(sys.modules, quick_gradio.MODULE, fake)
    assert quick_gradio.install() and fake.create_or_modify_pyi is quick_gradio._skip
    bare = ModuleType(quick_gradio.MODULE)
    monkeypatch.setitem(sys.modules, quick_gradio.MODULE, bare)
    assert not quick_gradio.install() and not hasattr(bare, "create_or_modify_pyi")
    assert not any(isinstance(f, quick_gradio._Finder) for f in sys.meta_path)


def test_the_hook_is_pinned_to_the_tested_gradio(monkeypatch):
    """Another Gradio version imports as Gradio ships it: the hook is not installed (and says so)."""
    from specviz.ui import quick_gradio

    assert quick_gradio.TESTED in (ROOT / "requirements.txt").read_text()  # the pin is the version we ship
    monkeypatch.setattr(quick_gradio, "_installed_version", lambda: "99.0.0")
    quick_gradio.uninstall()
    if "gradio.component_meta" in sys.modules:
        assert quick_gradio.install() is False
    else:
        assert quick_gradio.install() is False and not any(
            isinstance(f, quick_gradio._Finder) for f in sys.meta_path)
