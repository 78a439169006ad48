"""Class rooms (issue 58): bounds, expiry, codes, the teacher's secret, and the points' validation; an
attendee's poll, which rebuilds none of the page's outputs unless the page must move."""

from __future__ import annotations

import logging
import math

import pytest

from specviz.serving import rooms as R
from specviz.serving.rooms import PointRefused, RoomError, RoomStore

GOOD = {"alpha": 0.8, "mean_accepted_length": 3.2, "c": 0.2, "speedup": 1.6, "spread": 0.1, "gamma": 5,
        "epsilon": 0.0, "temperature": 0.0, "tokens": 48, "flagged": False, "drafter": "draft_model"}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    return RoomStore(max_rooms=3, size=2, hours=1.0, clock=clock)


def started(store):
    room = store.create()
    store.set_experiment(room.code, room.secret, "gamma")
    return room


def test_codes_are_unguessable_and_readable(store):
    assert len(R.CODE_ALPHABET) ** R.CODE_LENGTH >= 2**40
    codes = {R.new_code() for _ in range(2000)}
    assert len(codes) == 2000
    assert all(len(c) == R.CODE_LENGTH and set(c) <= set(R.CODE_ALPHABET) for c in codes)
    room = store.create()
    assert room.secret != room.code and len(room.secret) >= 20 and room.code not in room.secret
    # as typed from a projector: upper case, spaces, dashes
    typed = "-".join([room.code[:3], room.code[3:6].upper(), room.code[6:]])
    assert store.get(typed) is room
    assert R.clean_code("short") == "" and R.clean_code(None) == "" and R.clean_code("0" * 9) == ""


def test_rooms_are_bounded(store):
    for i in range(3):  # three teachers, each with an attendee: every room holds something
        room = store.create(f"10.0.0.{i}")
        store.join(room.code, f"a{i}", "10.1.0.1")
    with pytest.raises(RoomError, match="SPECVIZ_CLASS_ROOMS"):
        store.create("10.0.0.9")


def test_one_address_cannot_hold_every_room(clock):
    """Issue 62: one client opened all 50 rooms with ?class=new.  Its empty rooms make way for its next one; rooms
    that hold attendees stop it at its share, and the other addresses still open theirs."""
    store = RoomStore(max_rooms=10, size=5, hours=1.0, per_client=2, clock=clock)
    opened = [store.create("6.6.6.6") for _ in range(8)]  # a reloading ?class=new, or a script
    assert len(store) == 2 and all(store.get(r.code) is None for r in opened[:-2])
    for room in opened[-2:]:
        store.join(room.code, "someone", "6.6.6.7")
    with pytest.raises(RoomError, match="SPECVIZ_CLASS_ROOMS_PER_CLIENT"):
        store.create("6.6.6.6")
    assert store.create("192.0.2.1")  # another teacher is served


def test_a_full_server_reclaims_only_empty_idle_rooms(clock):
    store = RoomStore(max_rooms=2, size=5, hours=4.0, per_client=5, clock=clock)
    busy, empty = store.create("1.1.1.1"), store.create("2.2.2.2")
    store.join(busy.code, "a", "3.3.3.3")
    with pytest.raises(RoomError, match="SPECVIZ_CLASS_ROOMS"):  # the empty room's teacher was here just now
        store.create("4.4.4.4")
    clock.t += R.EMPTY_ROOM_IDLE_S + 1
    store.teacher(busy.code, busy.secret)
    assert store.create("4.4.4.4") and store.get(empty.code) is None and store.get(busy.code) is busy


def test_one_address_cannot_take_every_seat(clock):
    """One client took all 100 seats of a class: a newcomer from another address takes the seat of the address
    over its fair share; a class behind one NAT still fills the room."""
    store = RoomStore(max_rooms=3, size=4, hours=1.0, clock=clock)
    room = store.create("1.1.1.1")
    for i in range(4):
        clock.t += 1
        store.join(room.code, f"bot{i}", "6.6.6.6")
    store.join(room.code, "alice", "192.0.2.7")  # bot0 (seen least recently) made way
    assert "alice" in room.attendees and "bot0" not in room.attendees and len(room.attendees) == 4
    store.join(room.code, "bob", "192.0.2.8")
    assert len(room.attendees) == 4 and sum(s.startswith("bot") for s in room.attendees) == 2
    store.join(room.code, "carol", "192.0.2.9")  # four addresses: one seat each
    assert sum(s.startswith("bot") for s in room.attendees) == 1
    with pytest.raises(RoomError, match="full"):  # nobody holds more than one seat: a seat is never taken then
        store.join(room.code, "dave", "192.0.2.10")
    nat = RoomStore(max_rooms=3, size=4, hours=1.0, clock=clock)
    room = nat.create("1.1.1.1")
    for i in range(4):
        nat.join(room.code, f"pupil{i}", "203.0.113.5")  # a whole class behind one address fits
    assert len(room.attendees) == 4


def test_refusals_of_wrong_secrets_are_rate_limited(store, caplog):
    room = store.create()
    with caplog.at_level(logging.WARNING, logger="specviz.rooms"):
        for _ in range(500):
            with pytest.raises(RoomError):
                store.teacher(room.code, "guess")
    assert 1 <= len(caplog.records) <= 12


def test_only_a_point_number_removes_a_point(store):
    room = started(store)
    store.join(room.code, "a")
    point = store.post_point(room.code, "a", "race-0001", GOOD)
    assert point.id == 1
    for forged in (True, 1.0, "1", [1], None):
        assert store.remove_point(room.code, room.secret, forged) is False
    assert store.remove_point(room.code, room.secret, 1) is True
    with pytest.raises(RoomError, match="No such experiment"):
        store.set_experiment(room.code, room.secret, ["gamma"])


def test_a_room_is_bounded_by_its_size_and_frees_quiet_seats(store, clock):
    room = store.create()
    store.join(room.code, "a")
    store.join(room.code, "b")
    store.join(room.code, "a")  # a seat refreshed, not a new one
    with pytest.raises(RoomError, match="full"):
        store.join(room.code, "c")
    clock.t += R.ATTENDEE_IDLE_S + 1
    store.teacher(room.code, room.secret)  # the teacher keeps the room open
    assert store.join(room.code, "c") is room
    assert len(room.attendees) == 1


def test_rooms_expire_without_teacher_activity(store, clock):
    room = store.create()
    store.join(room.code, "a")
    clock.t += 3000
    store.set_view(room.code, room.secret, "rec", 2)  # the teacher: 50 min more
    clock.t += 3000
    assert store.get(room.code) is room
    clock.t += 700
    assert store.expire() == 1
    assert store.get(room.code) is None and len(store) == 0
    with pytest.raises(RoomError, match="No class is open"):
        store.join(room.code, "a")


def test_unknown_and_closed_codes_are_refused_in_words(store):
    with pytest.raises(RoomError, match="No class is open with the code"):
        store.join("abcdefghj", "a")
    room = store.create()
    store.close(room.code, room.secret)
    with pytest.raises(RoomError, match="No class is open"):
        store.join(room.code, "a")


def test_teacher_actions_need_the_secret(store, caplog):
    room = store.create()
    for bad in ("", "x" * 24, None, room.code):
        with pytest.raises(RoomError, match="Only the teacher"):
            store.set_view(room.code, bad, "rec", 3)
    with pytest.raises(RoomError):
        store.set_experiment(room.code, "nope", "gamma")
    with pytest.raises(RoomError):
        store.remove_point(room.code, "nope", 1)
    with pytest.raises(RoomError):
        store.close(room.code, "nope")
    assert room.step == 1 and room.experiment is None and store.get(room.code) is room
    assert "wrong secret" in caplog.text and "Traceback" not in caplog.text


def test_the_view_follows_the_teacher_and_keeps_few_payloads(store):
    room = store.create()
    v0 = room.version
    store.set_view(room.code, room.secret, "rec-a", 4)
    assert (room.view_key, room.step, room.version) == ("rec-a", 4, v0 + 1)
    store.set_view(room.code, room.secret, "rec-a", 4)  # nothing changed
    assert room.version == v0 + 1
    for i in range(R.VIEWS_KEPT + 2):
        store.set_view(room.code, room.secret, f"run-{i}", 1, payload={"i": i})
    assert len(room.payloads) == R.VIEWS_KEPT
    assert store.payload(room.code, f"run-{R.VIEWS_KEPT + 1}") == {"i": R.VIEWS_KEPT + 1}
    assert store.payload(room.code, "run-0") is None


def test_a_point_per_race_and_a_bound_per_attendee(store):
    room = started(store)
    store.join(room.code, "a")
    p = store.post_point(room.code, "a", "race-0001", GOOD)
    assert p.values["alpha"] == 0.8 and p.values["experiment"] == "gamma" and room.posters() == 1
    with pytest.raises(PointRefused, match="one point per race"):
        store.post_point(room.code, "a", "race-0001", GOOD)
    for i in range(2, R.POINTS_PER_ATTENDEE + 1):
        store.post_point(room.code, "a", f"race-{i:04d}", GOOD)
    with pytest.raises(PointRefused, match="the most one attendee may"):
        store.post_point(room.code, "a", "race-9999", GOOD)
    assert len(store.points(room.code)) == R.POINTS_PER_ATTENDEE


@pytest.mark.parametrize("change,why", [
    ({"alpha": 1.5}, "outside"), ({"alpha": math.nan}, "outside"), ({"speedup": math.inf}, "outside"),
    ({"speedup": 0.0}, "above 0"), ({"c": -1}, "outside"), ({"gamma": 0}, "below 1"),
    ({"alpha": "0.8"}, "not a number"), ({"alpha": True}, "not a number"), ({"alpha": None}, "no alpha"),
    ({"mean_accepted_length": 9.0}, "γ \\+ 1"), ({"flagged": "no"}, "true or false"), ({"drafter": ["x"]}, "not text"),
])
def test_forged_points_are_refused_in_one_line(store, caplog, change, why):
    room = started(store)
    store.join(room.code, "a")
    caplog.set_level(logging.WARNING, logger="specviz.rooms")
    with pytest.raises(PointRefused, match=why):
        store.post_point(room.code, "a", "race-0001", {**GOOD, **change})
    lines = [r for r in caplog.records if r.name == "specviz.rooms"]
    assert len(lines) == 1 and "refused a point" in lines[0].getMessage() and not lines[0].exc_info
    assert store.points(room.code) == []


def test_points_need_a_joined_page_an_experiment_and_an_open_room(store):
    room = store.create()
    store.join(room.code, "a")
    with pytest.raises(PointRefused, match="not started an experiment"):
        store.post_point(room.code, "a", "race-0001", GOOD)
    store.set_experiment(room.code, room.secret, "lose")
    with pytest.raises(PointRefused, match="not joined"):
        store.post_point(room.code, "stranger", "race-0001", GOOD)
    with pytest.raises(PointRefused, match="identity"):
        store.post_point(room.code, "a", "", GOOD)
    with pytest.raises(PointRefused):
        store.post_point(room.code, "a", "race-0001", "alpha=1")
    with pytest.raises(RoomError):
        store.set_experiment(room.code, room.secret, "no-such")
    store.close(room.code, room.secret)
    with pytest.raises(PointRefused, match="closed"):
        store.post_point(room.code, "a", "race-0001", GOOD)


def test_the_teacher_removes_a_point(store):
    room = started(store)
    store.join(room.code, "a")
    p = store.post_point(room.code, "a", "race-0001", GOOD)
    v = room.points_version
    assert store.remove_point(room.code, room.secret, p.id) is True
    assert store.remove_point(room.code, room.secret, p.id) is False
    assert store.points(room.code) == [] and room.points_version == v + 1


def test_an_attendees_poll_rebuilds_nothing_unless_the_page_must_move():
    """Gradio rebuilds every output an event leaves alone (~1 ms each): the poll's outputs are two States, set
    only when the page must move to the teacher's round (a sync of a few outputs) or recording (every view)."""
    import dataclasses
    from pathlib import Path

    import gradio as gr

    from specviz.ui import class_layout as CL
    from specviz.ui import classroom as C
    from specviz.ui.frames import LiveFrame, Slots
    from specviz.ui.store import Shown

    recs = sorted((Path(__file__).resolve().parents[1] / "assets" / "traces").glob("*.json"))
    ui = CL.ClassUI(**{f.name: object() for f in dataclasses.fields(CL.ClassUI)})
    views = Slots(LiveFrame, **{f.name: object() for f in dataclasses.fields(LiveFrame)})
    step = views["step"]
    small = frozenset([step, views["narration"], views["step_round"], ui.bar_text, ui.poll, ui.follow, ui.room,
                       ui.task, ui.posted, ui.seen, ui.want_all])
    room = C.ROOMS.create()
    try:
        teacher = {"code": room.code, "role": "teacher", "secret": room.secret}
        shown = Shown.shipped(recs[0])
        C.teacher_view(teacher, shown, 3)
        st = {"code": room.code, "role": "attendee"}

        said = C.attendee_sync(ui, views, step, recs, st, CL.FOLLOW, shown, 3, None, None)[ui.seen]  # the bar

        def poll(state, at, fn=C.attendee_poll, seen=said):
            return fn(ui, views, step, recs, st, CL.FOLLOW, state, at, seen, None, small)

        skip = gr.skip()
        assert poll(shown, 3) == {ui.want: skip, ui.want_all: skip, step: skip}  # in line: nothing at all
        # another round: the step itself (its change event draws the round)
        assert poll(shown, 2) == {ui.want: skip, ui.want_all: skip, step: 3}
        out = poll(shown, 3, seen="stale")  # the bar differs: the few outputs' sync
        assert isinstance(out[ui.want], int) and out[ui.want_all] == skip and out[step] == skip
        synced = poll(shown, 2, C.attendee_step, seen="stale")
        assert set(synced) <= small and synced[step] == 3 and synced[ui.seen] == said
        assert synced[views["narration"]] == C.live.step_views(shown.get("spec"), 3)[0]
        out = poll(None, 1)  # another recording (here: none shown yet): every view's sync
        assert out[ui.want] == skip and isinstance(out[ui.want_all], int)
        handed = poll(None, 1, C.attendee_step)  # the round's sync cannot: it hands over
        assert list(handed) == [ui.want_all] and handed[ui.want_all] != out[ui.want_all]
        full = C.attendee_sync(ui, views, step, recs, st, CL.FOLLOW, None, 1, said, None)
        assert len(full) > len(small) and full[views["state"]] == shown  # the full sync writes every view
    finally:
        C.ROOMS.close(room.code, room.secret)


def test_a_flagged_race_without_a_count_based_figure_still_posts_its_point_flagged():
    """A busy room's races are part of the experiment: a race whose clocks were flagged, with no count-based
    speedup to quote (the tiny pair has no probe), posts its wall clock's speedup, marked flagged (ringed)."""
    import dataclasses

    from specviz.core.settings import DecodeSettings
    from specviz.models import TINY_PRESET, load_pair
    from specviz.serving.service import race, tokenize
    from specviz.ui import class_views
    from specviz.views import html as V

    pair = load_pair(TINY_PRESET)
    req = tokenize(pair, "hello there", DecodeSettings.checked(max_new_tokens=12, gamma=3))
    done = list(race(req))[-1]
    spec, std = done.spec, done.std
    assert spec is not None and std is not None and spec.timing is not None
    spec = dataclasses.replace(spec, timing=dataclasses.replace(spec.timing, reliable=False, predicted=None))
    values = class_views.point_values(spec, std)
    assert values["flagged"] is True and values["speedup"] == pytest.approx(V.race_speedup(spec, std))
    assert R.check_point(values)["flagged"] is True  # and the room takes it
