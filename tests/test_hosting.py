"""Hosting: the Hugging Face Spaces front matter, ZeroGPU glue, the Deta Space manifest, ports."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import time
import types
import urllib.request

import gradio
import jsonschema
import psutil
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from specviz.models import DEFAULT_PRESET, OFFLINE_PACKS, PRESETS, TINY_PRESET
from specviz.serving import hosting
from specviz.serving.service import GPU_DEFAULT_PRESET
from specviz.trace import trace_from_dict
from tests.server import ROOT, free_port, stop_process

# ---- Hugging Face Spaces: the README's front matter -----------------------------------------

HF_HARDWARE = {"cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "zero-a10g", "a10g-small",
               "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large", "h100", "h100x8", "v5e-1x1", "v5e-2x2",
               "v5e-2x4"}
HF_COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@pytest.fixture(scope="module")
def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.match(r"---\n(.*?)\n---\n", text, flags=re.S)
    assert m, "README.md must start with a YAML block between '---' lines"
    meta = yaml.safe_load(m.group(1))
    assert isinstance(meta, dict)
    return meta


def test_front_matter_sdk(front_matter):
    assert front_matter["sdk"] == "gradio"
    assert front_matter["sdk_version"] == gradio.__version__, "the Space must run the Gradio the app is tested on"
    app_file = front_matter["app_file"]
    assert app_file == "app.py" and (ROOT / app_file).is_file()


def test_front_matter_python_version(front_matter):
    version = front_matter["python_version"]
    assert isinstance(version, str), "quote python_version: YAML reads 3.10 as the number 3.1"
    assert re.fullmatch(r"3\.\d+(\.\d+)?", version)
    for dist in ("gradio", "torch", "transformers"):  # the Space's Python must install our pins
        requires = importlib.metadata.metadata(dist)["Requires-Python"]
        assert Version(version) in SpecifierSet(requires), f"{dist} needs Python {requires}, the Space has {version}"


def test_front_matter_card(front_matter):
    assert front_matter["title"]
    assert front_matter["emoji"]
    assert front_matter["colorFrom"] in HF_COLORS and front_matter["colorTo"] in HF_COLORS
    assert front_matter["suggested_hardware"] in HF_HARDWARE
    assert front_matter["license"] in {"apache-2.0", "mit", "bsd-3-clause", "gpl-3.0", "cc-by-4.0", "other"}
    short = front_matter["short_description"]
    assert isinstance(short, str) and 0 < len(short) <= 60


def _hub_ids(preset) -> list[str]:
    return [ref for ref in (preset.draft, preset.target) if HUB_ID.match(ref)]


def _upstream(ref: str) -> str:
    """The hub repository a model reference comes from: a hub id itself, or for an offline pack the
    Qwen repository its GGUF file was made from ("Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)")."""
    if HUB_ID.match(ref):
        return ref
    assert ref.startswith("offline:"), ref
    return "Qwen/" + OFFLINE_PACKS[ref.removeprefix("offline:")].display.split(" ")[0]


def test_front_matter_models_are_what_the_default_runs(front_matter):
    """The Space's card links the models a CPU Space runs, the offline default pair, and no others
    (the hub presets are for GPU hosts, which docs/hosting.md tells how to preload)."""
    default = PRESETS[DEFAULT_PRESET]
    assert default.offline
    wanted = [_upstream(default.draft), _upstream(default.target)]
    assert wanted == ["Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    models = front_matter["models"]
    assert all(isinstance(m, str) and HUB_ID.match(m) for m in models)
    assert models == wanted, f"models: must list the default pair's models, {wanted}"


def test_front_matter_is_a_cpu_space_that_downloads_nothing(front_matter):
    """The measured default is the offline pair on a CPU: the card asks for a CPU, preloads nothing
    from the hub (the pair comes from pip), and docs/hosting.md gives a GPU Space the lines to add."""
    assert front_matter["suggested_hardware"].startswith("cpu-")
    assert not front_matter.get("preload_from_hub")
    hosting_doc = (ROOT / "docs" / "hosting.md").read_text(encoding="utf-8")
    gpu = PRESETS[GPU_DEFAULT_PRESET]
    wanted = _hub_ids(gpu)
    assert len(wanted) == 2 and "preload_from_hub" in hosting_doc
    for repo in wanted:
        assert f"  - {repo}" in hosting_doc, f"docs/hosting.md must show preload_from_hub listing {repo}"


# ---- ZeroGPU glue ------------------------------------------------------------------------


def _plain(x):
    return x


def _gen(n):
    yield from range(n)


@pytest.fixture()
def fake_spaces(monkeypatch):
    """A stand-in for the `spaces` package: GPU(duration=f) wraps like ZeroGPU, and records the
    duration it would ask for, computed from each call's own arguments."""
    mod = types.ModuleType("spaces")
    mod.durations, mod.requests = {}, []

    def GPU(fn=None, *, duration=60):  # noqa: N802 - the real name
        def decorate(f):
            mod.durations[f.__name__] = duration

            def ask(args, kwargs):
                mod.requests.append((f.__name__, duration(*args, **kwargs) if callable(duration) else duration))

            if inspect.isgeneratorfunction(f):
                @functools.wraps(f)
                def gen_wrapper(*args, **kwargs):
                    ask(args, kwargs)
                    yield from f(*args, **kwargs)
                return gen_wrapper

            @functools.wraps(f)
            def wrapper(*args, **kwargs):
                ask(args, kwargs)
                return f(*args, **kwargs)
            return wrapper

        return decorate(fn) if fn is not None else decorate

    mod.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", mod)
    return mod


def _off_spaces(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)


def test_gpu_is_a_no_op_without_spaces(monkeypatch):
    _off_spaces(monkeypatch)
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` fails
    assert hosting.gpu(duration=hosting.run_duration)(_plain) is _plain
    wrapped = hosting.gpu(duration=hosting.run_duration)(_gen)
    assert wrapped is _gen and inspect.isgeneratorfunction(wrapped)
    # On a ZeroGPU Space whose image lacks the package: still the function itself.
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert hosting.gpu(duration=hosting.run_duration)(_gen) is _gen


@pytest.mark.parametrize("env", [{}, {"SPACE_ID": "someone/specviz"}, {"SPACES_ZERO_GPU": "true"}],
                         ids=["not-on-spaces", "space-without-zerogpu", "zerogpu-flag-only"])
def test_gpu_is_a_no_op_outside_zerogpu_even_with_spaces_installed(monkeypatch, fake_spaces, env):
    _off_spaces(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert hosting.gpu(duration=hosting.run_duration)(_plain) is _plain
    assert hosting.gpu(duration=hosting.run_duration)(_gen) is _gen
    assert not fake_spaces.durations


def test_the_app_functions_are_plain_here():
    import app

    for fn in (app.run, app.sweep, app.api_trace):
        assert not hasattr(fn, "__wrapped__")
        assert inspect.isgeneratorfunction(fn)


def test_gpu_wraps_on_zerogpu_with_a_duration_from_the_request(monkeypatch, fake_spaces):
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    wrapped = hosting.gpu(duration=hosting.run_duration)(_gen)
    assert wrapped is not _gen and wrapped.__wrapped__ is _gen
    assert inspect.isgeneratorfunction(wrapped)
    assert list(wrapped(3)) == [0, 1, 2]

    def long_by_default(prompt, max_new_tokens=1000):
        return prompt

    assert hosting.gpu(duration=hosting.run_duration)(long_by_default)("x") == "x"
    assert fake_spaces.requests[-1] == ("long_by_default", 120)  # the function's own default counts

    # The real app, imported afresh on a (fake) ZeroGPU Space.
    spec = importlib.util.spec_from_file_location("app_on_zerogpu", ROOT / "app.py")
    zapp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zapp)
    assert {"run", "sweep", "api_trace"} <= set(fake_spaces.durations)
    for name in ("run", "sweep", "api_trace"):
        fn = getattr(zapp, name)
        assert fn.__wrapped__ and inspect.isgeneratorfunction(fn)

    # The duration follows the request's max_new_tokens (the UI's functions take a RunForm).
    from specviz.ui.form import RunForm

    ask = fake_spaces.durations
    form = RunForm(preset=TINY_PRESET, prompt="a prompt", max_new_tokens=500)
    assert ask["run"](form) == 70
    assert ask["run"](form=RunForm(max_new_tokens=1000, seed=3)) == 120
    assert ask["run"](RunForm(max_new_tokens=12), "session") == hosting.MIN_GPU_S
    assert ask["sweep"]("gamma", RunForm(max_new_tokens=100)) == min(hosting.MAX_GPU_S, 20 + hosting.SWEEP_RUNS * 10)
    assert ask["sweep"]("epsilon", RunForm(max_new_tokens=1024)) == hosting.MAX_GPU_S
    assert ask["api_trace"]("a prompt", TINY_PRESET, 5, 0.0, 0.0, 1.0, 400) == 60
    assert ask["api_trace"]("a prompt") == hosting.run_duration(32)  # the endpoint's default

    # Calling the wrapped endpoint asks ZeroGPU for that duration and still decodes.
    *_, doc = zapp.api_trace("hello", TINY_PRESET, 2, 0.0, 0.0, 1.0, 200, 0, "opt", False)
    assert fake_spaces.requests[-1] == ("api_trace", 40)
    assert 1 <= trace_from_dict(doc["speculative"]).n_tokens <= 200

    # Gradio still reads the endpoint's typed signature through the wrapper.
    demo = zapp.build()
    params = demo.get_api_info()["named_endpoints"]["/trace"]["parameters"]
    assert [p["parameter_name"] for p in params][:3] == ["prompt", "preset", "gamma"]
    assert [p["type"]["type"] for p in params][2:4] == ["integer", "number"]


@pytest.mark.parametrize("value,seconds", [(1024, 122), (64, 30), (0, 30), (-5, 30), (10**9, 300), (float("nan"), 30),
                                           (float("inf"), 300), ("abc", 30), (None, 30), ("800", 100)])
def test_run_duration_is_bounded(value, seconds):
    assert hosting.run_duration(max_new_tokens=value) == seconds
    assert hosting.MIN_GPU_S <= hosting.sweep_duration(max_new_tokens=value) <= hosting.MAX_GPU_S


# ---- ports ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env,expected", [
    ({}, ("0.0.0.0", 7860)),
    ({"GRADIO_SERVER_PORT": "8080"}, ("0.0.0.0", 8080)),
    ({"PORT": "9000", "GRADIO_SERVER_PORT": "8080"}, ("0.0.0.0", 9000)),  # the platform's PORT wins
    ({"PORT": "", "GRADIO_SERVER_PORT": "8080", "GRADIO_SERVER_NAME": "127.0.0.1"}, ("127.0.0.1", 8080)),
    ({"GRADIO_SERVER_NAME": "::"}, ("::", 7860)),
])
def test_server_address(env, expected):
    assert hosting.server_address(env) == expected


@pytest.mark.parametrize("port", ["abc", "0", "70000", "-1", "80.5"])
def test_server_address_refuses_bad_ports(port):
    with pytest.raises(ValueError, match="port number"):
        hosting.server_address({"PORT": port})


def test_the_app_listens_on_gradio_server_port_and_name(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PORT"}
    env.update(GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False",
               HF_HUB_OFFLINE="1", SPECVIZ_PRELOAD="0", PYTHONUNBUFFERED="1")
    log_path = tmp_path / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=2) as r:
                    config = json.loads(r.read())
                    break
            except OSError:
                assert time.time() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.5)
        assert config["version"] == gradio.__version__
        listening = {c.laddr for c in psutil.Process(proc.pid).net_connections("inet") if c.status == "LISTEN"}
        assert listening == {("127.0.0.1", port)}, listening  # GRADIO_SERVER_NAME: loopback only
        assert f"127.0.0.1:{port}" in log_path.read_text()
    finally:
        stop_process(proc)


# ---- Deta Space: the Spacefile ------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads((ROOT / "tests" / "spacefile.schema.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def spacefile() -> dict:
    return yaml.safe_load((ROOT / "Spacefile").read_text(encoding="utf-8"))


def test_schema_is_a_valid_json_schema(schema):
    jsonschema.Draft7Validator.check_schema(schema)


def test_spacefile_matches_the_schema(schema, spacefile):
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(spacefile), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def _set(doc: dict, path: str, value):
    d = copy.deepcopy(doc)
    *head, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = d
    for k in head:
        node = node[k]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path,value", [
    ("v", 1), ("v", "0"), ("micros", []), ("app_name", "a name longer than twelve"), ("colour", "red"),
    ("micros.0.engine", "python3.11"), ("micros.0.engine", "sveltekit"), ("micros.0.src", KeyError),
    ("micros.0.name", "-bad name"), ("micros.0.primary", "yes"), ("micros.0.runtime", "python"),
    ("micros.0.presets.env.0.name", KeyError), ("micros.0.presets.env.0.default", 0),
    ("micros.0.presets.env.0.name", "NOT-A-NAME"), ("micros.0.presets.api_keys", "true"),
    ("micros.0.presets.secrets", []), ("micros.0.public_routes", []),
])
def test_schema_rejects_broken_spacefiles(schema, spacefile, path, value):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_set(spacefile, path, value), schema, cls=jsonschema.Draft7Validator)


def test_spacefile_runs_this_app(spacefile):
    assert spacefile["v"] == 0
    (micro,) = spacefile["micros"]
    assert micro["primary"] is True
    assert micro["engine"] in ("python3.9", "python3.8")
    assert (ROOT / micro["src"] / "app.py").resolve() == (ROOT / "app.py").resolve()
    assert micro["run"] == "python app.py"
    assert (ROOT / micro["src"] / "requirements.txt").is_file()  # what Space installs for a Python micro


def test_spacefile_env_presets_are_read_by_the_app(spacefile):
    env = {e["name"]: e for e in spacefile["micros"][0]["presets"]["env"]}
    sources = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "app.py", *(ROOT / "specviz").rglob("*.py")])
    for name in env:
        if name.startswith("SPECVIZ_"):
            assert f'"{name}"' in sources, f"{name} is offered in the Spacefile but nothing reads it"
        assert env[name].get("description"), name
    assert env["SPECVIZ_ALLOW_CUSTOM"]["default"] == "0", "custom models (arbitrary downloads) stay off by default"
    assert env["SPECVIZ_QUEUE_SIZE"]["default"] == "64"
    assert env["SPECVIZ_CACHE"]["default"].startswith("/tmp/"), "micros can only write under /tmp"


# Read from the environment but not offered to a Space's operator: the tests' tiny random pair.
NOT_OFFERED = {"SPECVIZ_SHOW_TINY"}


def _sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "app.py", *(ROOT / "specviz").rglob("*.py")])


def test_spacefile_offers_every_setting_the_app_reads(spacefile):
    offered = {e["name"] for e in spacefile["micros"][0]["presets"]["env"]}
    read = set(re.findall(r'"(SPECVIZ_[A-Z_]+)"', _sources()))
    assert {"SPECVIZ_SESSIONS", "SPECVIZ_SWEEP_SECONDS", "SPECVIZ_JOB_SECONDS", "SPECVIZ_MAX_PROMPT_TOKENS",
            "SPECVIZ_QUEUE_SIZE"} <= read
    assert not read - offered - NOT_OFFERED, f"read by the app but not in the Spacefile: {read - offered - NOT_OFFERED}"


def test_spacefile_number_defaults_are_the_apps(spacefile):
    """Each numeric setting's default in the Spacefile is the one the code falls back to."""
    from specviz.serving import service, sweep_budget

    env = {e["name"]: e.get("default") for e in spacefile["micros"][0]["presets"]["env"]}
    found = re.findall(r'env_(?:int|number)\(\s*"(SPECVIZ_[A-Z_]+)",\s*([A-Za-z_][A-Za-z0-9_]*|[0-9.]+)', _sources())
    assert len(found) >= 12
    for name, default in found:
        value = float(default) if default[0].isdigit() else getattr(service, default, None) or getattr(sweep_budget, default)
        assert float(env[name]) == value, (name, env[name], value)


def test_a_page_sweeps_gpu_time_counts_its_repeats():
    """ZeroGPU's duration for a sweep covers what the page's sweep now runs: every configuration
    PAGE_SWEEP_REPEATS times round-robin with its baseline."""
    from specviz.experiments.repeats import PAGE_SWEEP_REPEATS

    assert hosting.SWEEP_RUNS == 15 * PAGE_SWEEP_REPEATS
    per_run = hosting.run_duration(max_new_tokens=64) - 20
    assert hosting.sweep_duration(max_new_tokens=64) == min(hosting.MAX_GPU_S, 20 + hosting.SWEEP_RUNS * per_run)


def test_a_module_absent_is_marked_once_and_an_installed_one_left_alone(monkeypatch):
    """Gradio's per-event `import matplotlib` fails at once once it is marked absent (no sys.path search), and
    nothing installed is ever marked."""
    import importlib.util
    import sys

    from specviz.serving import hosting

    monkeypatch.delitem(sys.modules, "specviz_surely_absent", raising=False)
    assert hosting.mark_absent(("specviz_surely_absent", "json")) == ["specviz_surely_absent"]
    try:
        assert sys.modules["specviz_surely_absent"] is None and "json" in sys.modules
        with pytest.raises(ImportError):
            import specviz_surely_absent  # noqa: F401
        assert importlib.util.find_spec("specviz_surely_absent") is None
        assert hosting.mark_absent(("specviz_surely_absent",)) == []  # once
    finally:
        del sys.modules["specviz_surely_absent"]
