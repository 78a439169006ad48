"""The package's layout: every module imports first on its own, and imports go one way between layers.

An import circle breaks whichever module of it happens to be imported first, so each module is
tried first: in one fresh interpreter, every specviz module is dropped from sys.modules before
the next is imported (third-party packages stay loaded, which keeps this fast).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specviz"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module(p) for p in PACKAGE.rglob("*.py"))

# layer -> the layers it must never import (the lower layers know nothing of the upper ones)
FORBIDDEN = {
    # the algorithm: no model backend (kv.register_backend), no drafter (the caller hands the engine its drafter;
    # the contract is core.drafting), no machine (hardware installs what it adds: core.engine.set_machine_describer)
    "core": ("models", "drafters", "hardware", "serving", "experiments", "ui", "views", "cli", "theory", "speculator"),
    "drafters": ("core.engine", "core.tree_round", "serving", "experiments", "ui", "views", "cli", "theory"),
    "trace": ("core.engine", "core.kv", "core.policy", "core.sampling", "core.tree_round", "drafters", "models",
              "hardware", "serving", "experiments", "ui", "views", "cli", "theory"),
    "theory": ("serving", "experiments", "ui", "views", "cli", "drafters", "models", "hardware"),
    "serving": ("experiments", "ui", "views", "cli"),
    "experiments": ("ui", "views", "cli"),
    "views": ("ui", "serving", "cli"),
    "hardware": ("serving", "experiments", "ui", "views", "cli", "theory"),
    # models <- hardware: the probe that chooses an execution is handed to the loader (hardware/choose.py)
    "models": ("core.engine", "hardware", "serving", "experiments", "ui", "views", "cli", "theory"),
    "speculator": ("serving", "experiments", "ui", "views", "cli"),
}


def test_every_module_imports_first_in_a_fresh_interpreter():
    assert len(MODULES) > 60 and "specviz.core.engine" in MODULES and "specviz.trace.schema" in MODULES
    script = (
        "import importlib, json, sys, traceback\n"
        "failed = {}\n"
        f"for name in {MODULES!r}:\n"
        "    for mod in [m for m in sys.modules if m == 'specviz' or m.startswith('specviz.')]:\n"
        "        del sys.modules[mod]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException:\n"
        "        failed[name] = traceback.format_exc(limit=-3)\n"
        "print(json.dumps(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{tb}" for name, tb in failed.items())


def _imports(path: Path) -> list[str]:
    """The specviz modules (or packages) a file imports, lazy imports included, as absolute names."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out += [f"{name}.{a.name}" for a in node.names] + [name]
    return [m for m in out if m == "specviz" or m.startswith("specviz.")]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_go_one_way_between_layers(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for name in _imports(path):
            for other in FORBIDDEN[layer]:
                if name == f"specviz.{other}" or name.startswith(f"specviz.{other}."):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_package_root_holds_only_layers():
    """One place per concept: no module left at the top beside the layers (and no shim of a moved one);
    export.py is only the entry point of `python -m specviz.export` (the code is specviz.cli.export)."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "export.py"]
    assert len((PACKAGE / "export.py").read_text().splitlines()) < 15
    layers = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert layers == ["cli", "core", "drafters", "experiments", "hardware", "models", "serving", "speculator",
                      "theory", "trace", "ui", "views"]


def _edges(path: Path) -> set[str]:
    """The specviz modules a file imports (lazy and TYPE_CHECKING imports included): ``from pkg import mod``
    is an edge to pkg.mod alone (importing a submodule runs its package first, always: no circle of its own),
    ``from pkg import name`` an edge to pkg."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for a in node.names:
                out.add(f"{name}.{a.name}" if f"{name}.{a.name}" in MODULES else name)
    return {m for m in out if m in MODULES and m != _module(path)}


GRAPH = {_module(p): _edges(p) for p in PACKAGE.rglob("*.py")}

# Circles still allowed, each with why.  serving/replay.py serves finished runs again and asks
# service.py for the live gate and the race, while service.py's race stores what it ran with replay:
# the two are one job split in two files (being reworked on their own: leave them to that work).
ALLOWED_CYCLES = [{"specviz.serving.replay", "specviz.serving.service"}]


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def test_no_import_circles_among_specviz_modules():
    """Issue 35: models <-> hardware (pair -> executions -> int8, pair), core.kv <-> models.compiled,
    trace.model <-> trace.summary, core <-> drafters (the engine building its drafter, the tree rule in
    drafters) were circles; none may come back, and no new one may appear."""
    found = _cycles(GRAPH)
    assert all(c in ALLOWED_CYCLES for c in found), "\n".join(" <-> ".join(sorted(c)) for c in found
                                                             if c not in ALLOWED_CYCLES)


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_the_named_circles_are_gone():
    """Each circle issue 35 named, checked on its own (lazy imports count: a circle through a function-local
    import still ties the two modules together)."""
    edges = {(m, o) for m, out in GRAPH.items() for o in out}
    assert ("specviz.trace.model", "specviz.trace.summary") not in edges or \
        ("specviz.trace.summary", "specviz.trace.model") not in edges
    assert not any(m.startswith("specviz.models.") and o.startswith("specviz.hardware") for m, o in edges)
    assert not any(m.startswith("specviz.core.") and o.split(".")[1] in ("models", "drafters", "hardware")
                   for m, o in edges)
    assert "specviz.core.verify" in GRAPH["specviz.core.tree_round"]  # the tree's rule, beside the chain's

