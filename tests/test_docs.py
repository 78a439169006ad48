"""The README and docs/ stay short, true and linked: every link and image resolves, no internal history (commit
hashes, "stop NN" labels), the benchmark tables are what scripts/gen_benchmarks.py makes from their JSON, every
SPECVIZ_* setting the app reads is in docs/hosting.md, and every deep link in the docs opens what it names.

Standard library and pytest only: no model, no server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [README, ROOT / "CHANGELOG.md", *DOCS]
README_MAX_LINES = 250
TEST_COMMAND = "pip install -r requirements-test.txt && python -m pytest"  # what CI runs (.ci/run)
INSTALL_COMMAND = "pip install -r requirements.txt && python app.py"

# Images made from the running app by a script, not by hand: while one is absent (the script has not been run
# in this checkout) the link test passes over it and test_screenshots_exist says so as a skip.
GENERATED_IMAGES = {"docs/images/race.png": "scripts/screenshots.py", "docs/images/step.png": "scripts/screenshots.py"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEXISH = re.compile(r"(?<![0-9A-Za-z_./-])([0-9a-f]{7,40})(?![0-9A-Za-z_])")
STOP_LABEL = re.compile(r"\bstops?\s*#?\s*\d+\b", re.I)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (where a link is an example, not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _links(path: Path) -> list[str]:
    prose = _prose(_text(path))
    return LINK.findall(prose) + HTML_SRC.findall(prose)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", _text(path)), flags=re.M)
    return {_slug(h) for h in headings}


def test_the_readme_is_short():
    lines = _text(README).splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"


def test_the_readme_gives_the_two_commands_ci_runs():
    text = _text(README)
    assert INSTALL_COMMAND in text and TEST_COMMAND in text
    ci = ROOT / ".ci" / "run"
    if ci.is_file():
        assert TEST_COMMAND in _text(ci), "the README's test command must be the one CI runs"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_image_resolves(doc):
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    broken = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = unquote(target).partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            if rel in GENERATED_IMAGES:
                continue  # made by its script; test_screenshots_exist reports it
            broken.append(f"{target} (no {rel})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


def test_screenshots_exist_and_were_made_from_the_current_app():
    """The README's pictures come from scripts/screenshots.py, whose manifest records each image's bytes and the
    app it was made from (its components' elem_ids and its style sheet): a page changed since fails here, and the
    script makes them again."""
    import hashlib
    import json
    import struct
    import sys

    manifest = json.loads((ROOT / "docs" / "images" / "manifest.json").read_text())
    for img in GENERATED_IMAGES:
        path = ROOT / img
        assert path.is_file(), f"{img} is missing: python {GENERATED_IMAGES[img]}"
        entry = manifest["images"][path.name]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], f"{img} is not the script's"
        assert list(struct.unpack(">II", path.read_bytes()[16:24])) == entry["size"]
    sys.path.insert(0, str(ROOT / "scripts"))
    from screenshots import app_fingerprint

    assert manifest["app_fingerprint"] == app_fingerprint(), (
        "the page changed since the screenshots were made: run python scripts/screenshots.py")


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_history_in_user_docs(doc):
    text = _text(doc)
    hashes = [h for h in HEXISH.findall(text) if re.search(r"[0-9]", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"{doc.relative_to(ROOT)}: commit-hash-like tokens {hashes}"
    labels = STOP_LABEL.findall(text)
    assert not labels, f"{doc.relative_to(ROOT)}: internal labels {labels}"


def test_the_benchmark_tables_are_what_the_script_makes():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_benchmarks.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "<!-- benchmarks:begin" in _text(README), "the README's table is generated: keep its markers"


def _read_settings() -> set[str]:
    sources = [ROOT / "app.py", *(ROOT / "specviz").rglob("*.py")]
    return {name for p in sources for name in re.findall(r"[\"'](SPECVIZ_[A-Z0-9_]+)[\"']", _text(p))}


def test_hosting_documents_every_setting_and_only_real_ones():
    documented = set(re.findall(r"SPECVIZ_[A-Z0-9_]+", _text(ROOT / "docs" / "hosting.md")))
    read = _read_settings()
    assert read, "no SPECVIZ_* setting found in the sources"
    assert not read - documented, f"read by the app but not in docs/hosting.md's table: {sorted(read - documented)}"
    anywhere = " ".join(_text(p) for d in ("specviz", "tests", "scripts") for p in (ROOT / d).rglob("*.py"))
    anywhere += _text(ROOT / "app.py")
    stale = sorted(n for n in documented if not re.search(rf"[\"']{n}[\"']", anywhere))
    assert not stale, f"docs/hosting.md documents settings nothing reads: {stale}"


def _recording_rounds() -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted((ROOT / "assets" / "traces").glob("*.json")):
        spec = json.loads(_text(p))["speculative"]
        out[p.stem] = (spec.get("prompt"), len(spec.get("rounds", [])))
    return out


def test_every_deep_link_in_the_docs_opens_what_it_names():
    recordings = _recording_rounds()
    examples = json.loads(_text(ROOT / "assets" / "examples.json"))
    queries = [(doc, q) for doc in USER_DOCS
               for q in re.findall(r"\?((?:recording|example|round|step|present)=[^`\s)|\"]*)", _text(doc))]
    assert len(queries) >= 5, "the docs' deep links were not found"
    for doc, query in queries:
        params = {k: v[0] for k, v in parse_qs(query.replace("&amp;", "&")).items()}
        where = f"{doc.relative_to(ROOT)}: ?{query}"
        rounds = None
        if "recording" in params:
            assert params["recording"] in recordings, f"{where}: no assets/traces/{params['recording']}.json"
            rounds = recordings[params["recording"]][1]
        if "example" in params:
            label = params["example"]
            if label.isdigit():
                assert 1 <= int(label) <= len(examples), f"{where}: there are {len(examples)} examples"
                ex = examples[int(label) - 1]
            else:
                ex = next((e for e in examples if e["label"].casefold() == label.casefold()), None)
                assert ex is not None, f"{where}: no example labelled {label!r}"
            if rounds is None:
                rounds = next((n for prompt, n in recordings.values() if prompt == ex["prompt"]), None)
        n = params.get("round") or params.get("step")
        if n is not None and rounds is not None:
            assert n.isdigit() and 1 <= int(n) <= rounds, f"{where}: the recording has {rounds} rounds"
        if "present" in params:
            assert params["present"] in ("0", "1"), where
