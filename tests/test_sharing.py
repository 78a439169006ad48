"""Issue 33, "One visitor cannot spoil the room", the sharing half: models, the trace store, exports and
sweeps are shared fairly between visitors.  Tiny pairs, fake loaders and plain threads: no server."""

from __future__ import annotations

import threading
import time

import pytest


# ---- 4. a sweep gives the models to live runs between its points ---------------------------------


def _hold(gate, priority, log, name, hold_s=0.0, started=None):
    """Enter the gate, note the order, hold it a moment, leave."""
    for _ in gate.enter(poll_s=0.02, priority=priority):
        pass
    log.append(name)
    if started is not None:
        started.set()
    time.sleep(hold_s)
    gate.leave()


def test_a_live_run_waiting_goes_before_a_sweep_waiting():
    from specviz.serving.replay import LiveGate

    gate = LiveGate(threading.Lock(), max_waiting=8, max_wait_s=10)
    order: list[str] = []
    for _ in gate.enter():
        pass  # something holds the gate
    sweep = threading.Thread(target=_hold, args=(gate, "sweep", order, "sweep"))
    sweep.start()
    time.sleep(0.2)  # the sweep waits first…
    live = threading.Thread(target=_hold, args=(gate, "live", order, "live"))
    live.start()
    time.sleep(0.2)  # …then a live run
    assert gate.waiting == 2 and gate.live_waiting == 1
    gate.leave()
    sweep.join(5)
    live.join(5)
    assert order == ["live", "sweep"]
    assert gate.waiting == 0 and gate.live_waiting == 0 and not gate.lock.locked()


def test_a_live_run_waits_behind_at_most_one_sweep_point():
    """A sweep of 6 points, 0.3 s each, holding the gate: a live run arriving during point 2 starts right
    after point 2, not after the sweep (it took the whole sweep before)."""
    from specviz.serving.replay import LiveGate
    from specviz.serving.sweep_budget import sweep_budget, within

    gate = LiveGate(threading.Lock(), max_waiting=8, max_wait_s=30)
    events: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def sweep():
        for _ in gate.enter(poll_s=0.02, priority="sweep"):
            pass
        budget = sweep_budget(60, gate=gate)
        try:
            for point in within(range(6), budget):
                events.append((f"point {point}", time.monotonic() - t0))
                time.sleep(0.3)
        finally:
            gate.leave()
        events.append(("sweep done", time.monotonic() - t0))
        assert budget.yielded_s > 0 and not budget.ran_out

    s = threading.Thread(target=sweep)
    s.start()
    time.sleep(0.45)  # during point 1 (0.3-0.6 s)
    arrived = time.monotonic() - t0
    live = threading.Thread(target=_hold, args=(gate, "live", [], "live", 0.1))
    live.start()
    live.join(10)
    started = time.monotonic() - t0
    events.append(("live", started))
    s.join(10)
    names = [n for n, _ in sorted(events, key=lambda e: e[1])]
    assert names.index("live") < names.index("point 3") and "sweep done" == names[-1], names
    assert started - arrived < 0.3 + 0.2, (arrived, started)  # at most one point (0.3 s) behind
    assert [n for n in names if n.startswith("point")] == [f"point {k}" for k in range(6)]  # the sweep finished


def test_a_sweep_without_live_runs_keeps_the_gate():
    from specviz.serving.replay import LiveGate
    from specviz.serving.sweep_budget import point_boundary, sweep_budget

    gate = LiveGate(threading.Lock(), max_waiting=8, max_wait_s=30)
    for _ in gate.enter(priority="sweep"):
        pass
    budget = sweep_budget(60, gate=gate)
    point_boundary(budget)
    point_boundary(lambda: False)  # any other should_stop: nothing to do
    assert gate.lock.locked() and budget.yielded_s == 0
    gate.leave()


def test_the_sweeps_tab_waits_at_the_gate_as_a_sweep(monkeypatch):
    """The Sweeps tab's sweeps enter the gate with the sweep priority and share it between points."""
    from specviz.models import TINY_PRESET
    from specviz.serving import replay
    from specviz.ui import tabs
    from specviz.ui.form import RunForm

    seen = []
    real_enter = replay.GATE.enter

    def enter(*a, **k):
        seen.append(k.get("priority", "live"))
        return real_enter(*a, **k)

    monkeypatch.setattr(replay.GATE, "enter", enter)
    budgets = []
    real = tabs.sweep_budget
    monkeypatch.setattr(tabs, "sweep_budget", lambda *a, **k: budgets.append(real(*a, **k)) or budgets[-1])
    form = RunForm(preset=TINY_PRESET, prompt="hello sweep", gamma=2, max_new_tokens=6)
    list(tabs.tree_sweep(form))
    assert "sweep" in seen and budgets and budgets[0].gate is replay.GATE
    assert not replay.GATE.lock.locked()


# ---- 2. the trace store: one session's uploads never empty another session's page -----------------


def _store(total_mb=24, session_mb=10):
    from specviz.ui.store import TraceStore

    return TraceStore(max_entries=256, max_bytes=int(total_mb * 2**20), session_bytes=int(session_mb * 2**20))


def test_a_sessions_entry_survives_four_other_sessions_uploads():
    """The issue's probe: one ~8 MB recording sent from 4 new sessions emptied the victim's page.  Now
    the uploaders, each over a fair share of the store, evict each other; the victim keeps its run."""
    store = _store()
    victim = store.put("victim spec", None, 300_000, session="victim")
    bigs = [store.put(f"big {k}", None, 8 * 2**20, session=f"attacker {k}") for k in range(4)]
    assert store.lookup(victim.id) == {"spec": "victim spec", "std": None}
    assert [store.lookup(b.id) is not None for b in bigs] == [False, False, True, True]  # the oldest went first
    assert store.nbytes <= store.max_bytes


def test_a_room_loading_big_recordings_one_after_another_is_not_locked_out():
    """Before the fair share, only the putting session's own entries could go: three 7 MB recordings
    filled the 24 MB store and every later visitor was refused until those sessions expired."""
    store = _store()
    shown = [store.put(f"big {k}", None, 7 * 2**20, session=f"visitor {k}") for k in range(22)]
    assert all(store.lookup(s.id) is not None for s in shown[-3:]) and store.nbytes <= store.max_bytes


def test_nobody_over_a_fair_share_means_a_clear_refusal():
    from specviz.ui.store import StoreFull

    store = _store(total_mb=12, session_mb=10)
    kept = [store.put(f"r{k}", None, 2 * 2**20 + k, session=f"s{k}") for k in range(4)]  # 8 MB, each under 12/5
    with pytest.raises(StoreFull, match="none over a fair share"):
        store.put("big", None, 5 * 2**20, session="new")
    assert all(store.lookup(s.id) is not None for s in kept)  # a refused put drops nothing of theirs


def test_the_uploaders_own_oldest_entries_go_first():
    store = _store(total_mb=24, session_mb=10)
    other = store.put("other", None, 2**20, session="b")
    mine = [store.put(f"mine {k}", None, 3 * 2**20, session="a") for k in range(3)]  # 9 MB of a's 10
    store.lookup(mine[0].id)  # seen again: now the most recently used of a's
    newest = store.put("mine 3", None, 3 * 2**20, session="a")  # over a's share: a's least recently used goes
    assert store.lookup(mine[1].id) is None
    assert all(store.lookup(s.id) is not None for s in (mine[0], mine[2], newest, other))
    assert store.session_nbytes("a") == 9 * 2**20 and store.session_nbytes("b") == 2**20


def test_a_run_over_a_sessions_share_is_refused_with_a_message():
    from specviz.ui.store import StoreFull

    store = _store(total_mb=24, session_mb=4)
    kept = store.put("kept", None, 2**20, session="a")
    with pytest.raises(StoreFull, match=r"too large.*each visitor may keep 4.0 MB"):
        store.put("huge", None, 5 * 2**20, session="a")
    assert store.lookup(kept.id) is not None  # a refused put drops nothing


def test_a_session_ending_drops_all_its_entries_and_only_them():
    store = _store()
    a = [store.put(f"a{k}", None, 100, session="a") for k in range(3)]
    b = store.put("b", None, 100, session="b")
    store.drop(a[-1])
    assert all(store.lookup(s.id) is None for s in a) and store.lookup(b.id) is not None
    assert store.nbytes == 100


def test_the_page_shows_the_refusal_instead_of_a_traceback(monkeypatch):
    """A recording that cannot be kept for this session: the status line says why, the page keeps its run."""
    from pathlib import Path

    from specviz.trace import load_recording
    from specviz.ui import live
    from specviz.ui.frames import SKIP
    from specviz.ui.store import as_session

    from specviz.trace import recording_to_json

    path = Path(__file__).resolve().parent.parent / "assets" / "traces" / "1-code-greedy.json"
    spec, std = load_recording(path.read_bytes())
    size = len(recording_to_json(spec, std))
    store = _store(total_mb=1.5 * size / 2**20, session_mb=1.5 * size / 2**20)
    monkeypatch.setattr(live, "STORE", store)
    with as_session("other"):  # within its fair share (half the store), and too much left for this one to fit
        store.put("other's run", None, int(0.7 * size))
    with as_session("me"):
        frame = live.final_frame(spec, std, "ok")
    assert "other visitors" in frame.status and frame.state is SKIP and frame.rounds is SKIP
    with as_session("other"):  # the owner of the space can show it: its own entry makes room
        frame = live.final_frame(spec, std, "ok")
    assert frame.state is not SKIP and frame.state.session == "other"


# ---- 3. "Download as a page": its own small concurrency, one per session, priced by size ---------


def test_a_second_export_in_the_same_session_is_refused_while_one_runs():
    from specviz.ui.export_ui import ExportBusy, ExportSlots

    slots = ExportSlots(limit=2, max_bytes=8 * 2**20)
    with slots.slot("a", 2**20):
        with pytest.raises(ExportBusy, match="Your page is still being made"):
            with slots.slot("a", 100):
                pass
        with slots.slot("b", 4 * 2**20):  # another session: a slot of its own
            with pytest.raises(ExportBusy, match=r"making 2 other page\(s\) \(about \d+ s of work left\)"):
                with slots.slot("c", 100):
                    pass
    assert slots.running == 0
    with slots.slot("a", 100):  # free again
        pass
    with pytest.raises(ExportBusy, match=r"too large .*9\.0 MB.*limit is 8 MB.*about 20 s"):
        with slots.slot("d", 9 * 2**20):
            pass


def test_download_page_answers_a_busy_session_at_once_without_the_model_gate(monkeypatch, tmp_path):
    from pathlib import Path

    from specviz.serving.replay import GATE
    from specviz.trace import load_recording
    from specviz.ui import export_ui
    from specviz.ui.store import as_session

    monkeypatch.setenv("SPECVIZ_EXPORT_DIR", str(tmp_path))
    path = Path(__file__).resolve().parent.parent / "assets" / "traces" / "1-code-greedy.json"
    spec, std = load_recording(path.read_bytes())
    state = {"spec": spec, "std": std}
    started, release = threading.Event(), threading.Event()
    real = export_ui.write_page

    def slow_write(*a, **k):
        started.set()
        release.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(export_ui, "write_page", slow_write)
    out = {}

    def first():
        with as_session("s1"):
            out["first"] = export_ui.download_page(state)

    GATE.lock.acquire()  # the models busy with a long run: exports do not wait for them
    try:
        t = threading.Thread(target=first)
        t.start()
        assert started.wait(10)
        with as_session("s1"):
            t0 = time.monotonic()
            page, status = export_ui.download_page(state)
        assert time.monotonic() - t0 < 1 and "still being made" in status and page["value"] is None
        release.set()
        t.join(180)  # the page is made in a child process (specviz/cli/page_worker.py): on a busy machine, a while
    finally:
        GATE.lock.release()
    assert not t.is_alive()
    page, status = out["first"]
    assert page["visible"] and Path(page["value"]).is_file()


# ---- 1. models are shared, never thrashed ---------------------------------------------------------


@pytest.fixture
def fake_pairs(monkeypatch):
    """A fake preset of hub models and a loader that builds nothing: the default pair and what a visitor asks."""
    from types import SimpleNamespace

    from specviz.models import PRESETS, loading
    from specviz.models.presets import Preset
    from specviz.serving import service

    loads = []

    def fake_load(label, draft_ref, target_ref, dev, dt, quant, progress, t0, *, target_exec, alpha,
                  defer_packing=False):
        loads.append((label, target_exec))
        return SimpleNamespace(preset=label, target_exec="int8" if target_exec == "auto" else target_exec,
                               probe=None, target_name=target_ref, draft=None, target=None)

    monkeypatch.setattr(loading, "_load_uncached", fake_load)
    monkeypatch.setattr(loading, "_PAIRS", type(loading._PAIRS)())
    monkeypatch.setattr(loading, "_PINNED", set())
    presets = dict(PRESETS)
    presets["Fake default"] = Preset("fake", "Fake default", "fake/draft", "fake/target", False, "", params_b=(0.5, 1.5))
    presets["Fake hub"] = Preset("fakehub", "Fake hub", "fake/draft", "fake/big-target", False, "", params_b=(0.5, 7.0))
    for mod in (loading, service):
        monkeypatch.setattr(mod, "PRESETS", presets)
    import specviz.models.presets as P

    monkeypatch.setattr(P, "PRESETS", presets)
    monkeypatch.setattr(service, "default_preset", lambda: "Fake default")
    monkeypatch.setattr(service, "_default_target_exec", lambda raw, zero=False: "auto")
    monkeypatch.setattr(loading, "on_disk", lambda ref: ref != "fake/big-target")
    monkeypatch.delenv("SPECVIZ_ALLOW_DOWNLOADS", raising=False)
    monkeypatch.delenv("SPECVIZ_MEMORY_GB", raising=False)
    return loads


def test_the_default_pair_stays_whatever_visitors_ask(fake_pairs):
    from specviz.serving.service import get_pair

    default = get_pair(None)
    for execution in ("bf16", "fp32", "bf16", "fp32"):  # two pairs were kept: these used to evict the default
        get_pair("Fake default", target_exec=execution)
    assert get_pair(None) is default and get_pair("Fake default", target_exec="int8") is default
    assert fake_pairs.count(("Fake default", "auto")) == 1  # never reloaded


def test_a_visitors_bf16_over_the_memory_budget_is_refused_and_the_default_untouched(fake_pairs, monkeypatch):
    from specviz.serving.service import InputError, get_pair

    default = get_pair(None)
    monkeypatch.setenv("SPECVIZ_MEMORY_GB", "0.001")
    with pytest.raises(InputError, match=r"exceed this server's memory budget of 0\.0 GB \(SPECVIZ_MEMORY_GB\)"):
        get_pair("Fake default", target_exec="bf16")
    assert get_pair(None) is default and len(fake_pairs) == 1


def test_a_load_the_budget_admits_is_refused_with_the_figures_when_memory_is_not_available(fake_pairs, monkeypatch):
    """The budget is the app's own accounting: with 3 GB available and a 6 GB load asked for, it is refused, in
    words with both figures, and nothing is loaded (an fp32 load once drove available memory to 0.4 GB)."""
    from specviz.models import loading
    from specviz.serving import service
    from specviz.serving.service import InputError, get_pair

    get_pair(None)
    monkeypatch.setenv("SPECVIZ_MEMORY_GB", "64")
    monkeypatch.setattr(loading, "estimate_bytes", lambda *a, **k: 6 * 2**30)
    monkeypatch.setattr(service, "available_bytes", lambda: 3 * 2**30)
    with pytest.raises(InputError, match=r"needs about 6\.0 GB, and this machine has 3\.0 GB of memory available"):
        get_pair("Fake default", target_exec="fp32")
    assert len(fake_pairs) == 1
    monkeypatch.setattr(service, "available_bytes", lambda: 8 * 2**30)
    get_pair("Fake default", target_exec="fp32")
    assert fake_pairs[-1] == ("Fake default", "fp32")


def test_the_memory_available_is_read_from_the_system():
    import psutil

    from specviz.serving.service import available_bytes

    got = available_bytes()
    assert got is not None and abs(got - psutil.virtual_memory().available) < 2**30


def test_a_visitors_load_counts_at_the_gate(fake_pairs, monkeypatch):
    """Loading another execution for a visitor waits for the live gate (Busy when it is full)."""
    from specviz.serving import replay
    from specviz.serving.service import get_pair

    get_pair(None)
    monkeypatch.setattr(replay.GATE, "max_wait_s", 0.3)
    replay.GATE.lock.acquire()  # a run holds the models
    try:
        with pytest.raises(replay.Busy, match="busy"):
            get_pair("Fake default", target_exec="bf16")
        assert len(fake_pairs) == 1
        get_pair(None)  # the default pair is served at once
    finally:
        replay.GATE.lock.release()
    get_pair("Fake default", target_exec="bf16")
    assert fake_pairs[-1] == ("Fake default", "bf16") and not replay.GATE.lock.locked()


def test_a_hub_preset_not_on_disk_is_refused_unless_the_host_allows_downloads(fake_pairs, monkeypatch):
    from specviz.serving.service import InputError, get_pair

    with pytest.raises(InputError, match=r"not on this server's disk \(fake/big-target\).*SPECVIZ_ALLOW_DOWNLOADS=1"):
        get_pair("Fake hub")
    assert fake_pairs == []
    monkeypatch.setenv("SPECVIZ_ALLOW_DOWNLOADS", "1")
    monkeypatch.setenv("SPECVIZ_MEMORY_GB", "64")
    monkeypatch.setattr("specviz.serving.service.available_bytes", lambda: 64 * 2**30)  # not this machine's
    get_pair("Fake hub")
    assert fake_pairs == [("Fake hub", "auto")]


def test_a_run_job_loading_another_pair_waits_at_the_gate_first(fake_pairs, monkeypatch):
    """run_job's loading of a non-default pair happens inside the gate: Waiting comes before the load."""
    from specviz.serving import jobs

    order = []
    real_enter = jobs.GATE.enter

    def enter(*a, **k):
        order.append("gate")
        return real_enter(*a, **k)

    monkeypatch.setattr(jobs.GATE, "enter", enter)
    monkeypatch.setattr(jobs, "get_pair", lambda *a, gated=False, **k: order.append(("load", gated)) or 1 / 0)
    job = jobs.RunForm(preset="Fake default", prompt="hi", target_exec="bf16").check()
    assert job.loads
    with pytest.raises(ZeroDivisionError):
        list(jobs.run_job(job))
    assert order == ["gate", ("load", True)] and not jobs.GATE.lock.locked()


def test_real_hf_cache_lookups_are_offline_and_plain():
    from specviz.models import loading

    assert loading.on_disk("offline:qwen2.5-coder-0.5b") and loading.on_disk("tiny:draft")
    assert not loading.on_disk("nobody-has/this-model-xyz")
    assert loading.estimate_bytes("Qwen2.5-Coder 0.5B → 1.5B (offline)", target_exec="fp32") > \
        loading.estimate_bytes("Qwen2.5-Coder 0.5B → 1.5B (offline)", target_exec="int8")
