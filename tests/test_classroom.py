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


# ---- issue 66: a class a teacher can rely on -------------------------------------------------------------------

def _ui():
    import dataclasses

    from specviz.ui import class_layout as CL
    from specviz.ui.frames import LiveFrame, Slots

    ui = CL.ClassUI(**{f.name: object() for f in dataclasses.fields(CL.ClassUI)})
    views = Slots(LiveFrame, **{f.name: object() for f in dataclasses.fields(LiveFrame)})
    return ui, views


def _request(query=None, session="s1", host="192.0.2.1"):
    from types import SimpleNamespace

    return SimpleNamespace(query_params=query or {}, session_hash=session, headers={"referer": "http://h/"},
                           client=SimpleNamespace(host=host), url="http://h/")


def _client(browser="", teacher="", reopen=""):
    import json

    return json.dumps({"id": browser, "teacher": teacher, "reopen": reopen})


def _recordings():
    from pathlib import Path

    return sorted((Path(__file__).resolve().parents[1] / "assets" / "traces").glob("*.json"))


@pytest.fixture
def closing():
    """Rooms of the app's one store opened by a test, closed after it."""
    from specviz.ui import classroom as C

    made = []
    yield made
    for room in made:
        try:
            C.ROOMS.close(room.code, room.secret)
        except RoomError:
            pass


def test_made_up_ids_cannot_grow_a_room_without_bound(store, clock):
    room = started(store)
    store.join(room.code, "keeper")
    store.post_point(room.code, "keeper", "race-0001", GOOD)
    for i in range(200):
        clock.t += R.ATTENDEE_IDLE_S + 1  # each seat goes quiet, the next one takes a seat
        store.teacher(room.code, room.secret)
        store.join(room.code, f"bot-{i}")
    assert len(room.names) <= 4 * store.size + 1 and room.attendee_number("keeper") == 1
    assert room.attendee_number("bot-199") == 201  # numbers are never reused


def test_a_seat_is_a_browser_and_its_id_is_kept_nowhere():
    a, b = "a" * 22, "b" * 22
    assert R.seat_key(a, "tab-1") == R.seat_key(a, "tab-2") != R.seat_key(b, "tab-1")
    assert a not in R.seat_key(a)
    for junk in ("", "short", "x" * 65, "<script>alert(1)</script>xxxxxxxx", None, 17, ["a" * 22]):
        assert R.seat_key(junk, "tab-1") == R.seat_key(None, "tab-1") != R.seat_key(None, "tab-2")


def test_parse_client_takes_only_what_it_expects():
    from specviz.ui.class_client import ident, parse_client

    assert parse_client(_client("c" * 30, "s3cret", "")) == {"id": "c" * 30, "teacher": "s3cret", "reopen": ""}
    for junk in (None, "", "[1]", "{", '{"id": 5}', "x" * 5000, '{"id": "bad id!"}'):
        assert parse_client(junk)["id"] == ""
    assert ident(None) == "" and '"gone"' in ident(None, "abc")
    st = {"code": "c", "role": "attendee", "seat": "b:1"}
    assert "seat" not in ident(st) and "secret" not in ident({**st, "secret": "x"})
    assert '"secret": "x"' in ident({"code": "c", "role": "teacher", "secret": "x"})


def test_one_browser_is_one_attendee_however_many_tabs_and_reloads(closing):
    """Issue 66: "2 of 4 attendees have posted" with two attendees, one with a second tab and one reload."""
    from specviz.ui import classroom as C
    from specviz.ui.class_views import bar_html, count_html

    ui, _ = _ui()
    room = C.ROOMS.create("198.51.100.1")
    closing.append(room)
    C.ROOMS.set_experiment(room.code, room.secret, "gamma")
    alice, bob = "a1" * 11, "b2" * 11
    pages = [(alice, "tab-1"), (alice, "tab-2"), (bob, "tab-3"), (bob, "tab-3-reloaded")]
    for browser, session in pages:
        out = C.join_class(ui, room.code, _client(browser), _request(session=session))
        assert out[ui.room]["role"] == "attendee"
    assert len(room.attendees) == 2 and room.people() == 2
    seat = C.join_class(ui, room.code, _client(alice), _request(session="tab-9"))[ui.room]["seat"]
    C.ROOMS.post_point(room.code, seat, "race-0001", GOOD)
    assert 'data-people="2"' in bar_html(room, "teacher") and "2 attendees" in bar_html(room, "teacher")
    assert "1 of 2 attendees has posted" in count_html(room)
    # a page without an id (a script, blocked storage): a seat of its own session, as before
    C.join_class(ui, room.code, "", _request(session="script-1"))
    assert room.people() == 3
    # nothing the server shows or exports names a browser's id or its seat (no one can take another's seat)
    from specviz.ui.class_plot import class_plot
    from specviz.ui.class_views import point_choices, write_points

    shown = [bar_html(room, "teacher"), count_html(room), str(point_choices(room)),
             class_plot(room).to_json(), *(open(f).read() for f in write_points(room))]
    for secret in (alice, bob, seat, R.seat_key(bob)):
        assert not any(secret in text for text in shown)


def test_the_teacher_refresh_keeps_the_bar_and_the_count_in_step(closing):
    from specviz.ui import classroom as C

    ui, _ = _ui()
    out = C.on_load(ui, _client("t" * 20), _request({"class": "new"}))
    st = out[ui.room]
    room = C.ROOMS.get(st["code"])
    closing.append(room)
    C.join_class(ui, room.code, _client("z" * 20), _request(session="att"))
    live = C.teacher_refresh(ui, st, out[ui.seen])
    assert 'data-people="1"' in live[ui.bar_text] and 'data-people="1"' in live[ui.count]


def test_a_reloaded_teacher_page_is_the_teacher_of_the_same_class_where_it_was(closing):
    """Issue 66: ?class=new made a new class on every reload; the private link reset the round and recording."""
    from specviz.ui import classroom as C
    from specviz.ui.store import Shown

    ui, views = _ui()
    recs = _recordings()
    first = C.on_load(ui, _client("t" * 20), _request({"class": "new"}))
    st = first[ui.room]
    room = C.ROOMS.get(st["code"])
    closing.append(room)
    n = len(C.ROOMS)
    shown = Shown.shipped(recs[1])
    C.teacher_view(st, shown, 4)
    C.ROOMS.set_experiment(room.code, room.secret, "epsilon")
    assert (room.view_key, room.step) == ("rec:" + recs[1].name, 4)

    # three ways back: this tab's ?class=new, the code with the kept secret, the private link
    for client, query in [(_client("t" * 20, room.secret, room.code), {"class": "new"}),
                          (_client("t" * 20, room.secret), {"class": room.code}),
                          (_client(), {"class": room.code, "teacher": room.secret})]:
        out = C.on_load(ui, client, _request(query, session="reloaded"))
        again = out[ui.room]
        assert again["role"] == "teacher" and again["code"] == room.code and len(C.ROOMS) == n
        assert prop(out[ui.experiment], "value") == "epsilon" and isinstance(out[ui.restore], int)
        # the page's own start lands (the first recording, round 1): the room keeps its view, and the page is
        # told to show the room's (its sync), which it then does
        default = Shown.shipped(recs[0])
        assert isinstance(C.teacher_moved(ui, again, default, 1)[ui.want_all], int)
        C.on_step(again, default, 1)
        assert (room.view_key, room.step) == ("rec:" + recs[1].name, 4)
        synced = C.attendee_sync(ui, views, views["step"], recs, again, None, default, 1)
        assert synced[views["state"]] == shown and prop(synced[views["step"]], "value") == 4
        assert C.teacher_moved(ui, again, shown, 4)[ui.want_all] == gr_skip()  # it shows the room's: restored
        C.teacher_view(again, shown, 5)  # and now the teacher leads again
        assert room.step == 5
        C.teacher_view(again, shown, 4)


def gr_skip():
    import gradio as gr

    return gr.skip()


def prop(update, name):
    """A property an event sets: from an update dict, or from the component a handler returned."""
    return update.get(name) if isinstance(update, dict) else getattr(update, name)


def test_start_on_a_teaching_page_and_new_without_storage_make_no_second_class(closing):
    from specviz.ui import classroom as C

    ui, _ = _ui()
    out = C.on_load(ui, _client(), _request({"class": "new"}))
    st = out[ui.room]
    closing.append(C.ROOMS.get(st["code"]))
    again = C.start_class(ui, st, _client(), None, 1, _request())
    assert again[ui.room] is st and "already" in again[ui.message]


def test_a_stale_kept_secret_is_forgotten_and_the_page_is_told(closing):
    from specviz.ui import classroom as C

    ui, _ = _ui()
    out = C.on_load(ui, _client("t" * 20, "secret-of-a-gone-class"), _request({"class": "abcdefghj"}))
    assert out[ui.room] is None and '"gone"' in out[ui.ident] and "closed" in out[ui.message]


def _point(**change):
    return {**GOOD, **change}


def test_each_experiment_keeps_its_points_axes_and_reference(closing):
    """Issue 66: switching experiments redrew the earlier points on the new axis; ε points read "γ 4"."""
    import json

    from specviz.trace.summary import theoretical_speedup
    from specviz.ui import classroom as C
    from specviz.ui.class_plot import class_plot
    from specviz.ui.class_views import count_html, point_choices, write_points

    room = C.ROOMS.create()
    closing.append(room)
    C.ROOMS.join(room.code, "a")
    C.ROOMS.set_experiment(room.code, room.secret, "gamma")
    C.ROOMS.post_point(room.code, "a", "race-gamma-1", _point(gamma=3, v=1.8, c=0.3, alpha=0.7))
    C.ROOMS.post_point(room.code, "a", "race-gamma-2", _point(gamma=6, v=2.2, c=0.3, alpha=0.7))
    C.ROOMS.set_experiment(room.code, room.secret, "epsilon")
    assert "0 points" in count_html(room) and point_choices(room) == []
    assert "No points yet" in json.dumps(class_plot(room).to_plotly_json(), ensure_ascii=False)
    for i, eps in enumerate((0.1, 0.3)):
        C.ROOMS.post_point(room.code, "a", f"race-epsilon-{i}", _point(gamma=4, epsilon=eps, alpha=0.8 + i / 10))
    assert [label for label, _ in point_choices(room)] == ["#3 · attendee 1 · ε 0.1 · α 0.80",
                                                           "#4 · attendee 1 · ε 0.3 · α 0.90"]
    fig = class_plot(room)
    races = next(t for t in fig.data if (t.name or "").startswith("races"))
    assert list(races.x) == [0.1, 0.3] and list(races.y) == [0.8, 0.9]  # ε against α, only the ε points
    assert "ε" in fig.layout.xaxis.title.text and fig.layout.xaxis.range[0] < 0.1 < 0.3 < fig.layout.xaxis.range[1]
    # back to γ: its own two points, over Thm 3.8 at the class's measured α, c, v, and the textbook v = 1 faint
    C.ROOMS.set_experiment(room.code, room.secret, "gamma")
    fig = class_plot(room)
    races = next(t for t in fig.data if (t.name or "").startswith("races"))
    assert list(races.x) == [3.0, 6.0]
    measured, textbook = (t for t in fig.data if t.mode == "lines")
    assert "measured v = 2.00" in measured.name and "v = 1" in textbook.name
    at = list(measured.x).index(4.0)
    assert measured.y[at] == pytest.approx(theoretical_speedup(0.7, 4, 0.3, 2.0))
    assert textbook.y[at] == pytest.approx(theoretical_speedup(0.7, 4, 0.3, 1.0))
    assert textbook.y[at] > measured.y[at]
    lo, hi = fig.layout.xaxis.range
    assert lo < 3 < 6 < hi <= 7.6  # the axis fits the points
    # the export: every experiment's points, with their settings and costs
    csv_path, json_path = write_points(room)
    header = open(csv_path).readline().strip().split(",")
    for name in ("experiment", "gamma", "epsilon", "temperature", "policy", "drafter", "v", "c", "alpha", "speedup",
                 "flagged"):
        assert name in header
    data = json.load(open(json_path))
    assert set(data["experiments"]) == {"gamma", "epsilon"} and len(data["points"]) == 4
    assert [p["epsilon"] for p in data["experiments"]["epsilon"]["points"]] == [0.1, 0.3]
    assert data["experiments"]["gamma"]["reference"]["v"] == pytest.approx(2.0)


def test_points_are_bounded_per_experiment(store):
    room = started(store)
    store.join(room.code, "a")
    for i in range(R.POINTS_PER_ATTENDEE):
        store.post_point(room.code, "a", f"race-{i:04d}", GOOD)
    with pytest.raises(PointRefused, match="this experiment"):
        store.post_point(room.code, "a", "race-9999", GOOD)
    store.set_experiment(room.code, room.secret, "lose")
    assert store.post_point(room.code, "a", "race-9999", GOOD).values["experiment"] == "lose"


def test_a_removed_point_stays_removed(store):
    """Issue 66: a removed point still read "Posted" on the attendee's page, and one click on Post put it back."""
    from specviz.ui import class_views

    room = started(store)
    store.join(room.code, "a")
    p = store.post_point(room.code, "a", "race-0001", GOOD)
    store.remove_point(room.code, room.secret, p.id)
    with pytest.raises(PointRefused, match="removed this race"):
        store.post_point(room.code, "a", "race-0001", GOOD)
    assert store.points(room.code) == [] and [q.id for q in store.points(room.code, removed=True)] == [p.id]
    assert store.post_point(room.code, "a", "race-0002", GOOD)  # another race is welcome
    store.join(room.code, "b")
    assert store.post_point(room.code, "b", "race-0001", GOOD)  # (and another attendee's same settings)
    original = class_views.ROOMS
    class_views.ROOMS = store
    try:
        mine = class_views.mine_html(room, "a")
    finally:
        class_views.ROOMS = original
    assert "Removed by the teacher: #1" in mine and "refused" in mine and "Posted to the class: #2" in mine


def test_an_ended_class_keeps_its_points_for_its_teacher_until_it_expires(store, clock):
    room = started(store)
    store.join(room.code, "a")
    store.post_point(room.code, "a", "race-0001", GOOD)
    store.close(room.code, room.secret)
    assert store.get(room.code) is None and len(store) == 0  # closed to everyone else
    with pytest.raises(RoomError, match="No class is open"):
        store.join(room.code, "a")
    with pytest.raises(RoomError, match="has ended"):
        store.teacher(room.code, room.secret)
    with pytest.raises(RoomError, match="Only the teacher"):
        store.results(room.code, "guess")
    assert store.results(room.code, room.secret) is room and len(store.points(room.code)) == 1
    clock.t += 3600 + 1  # the class's lifetime (hours=1.0) from the teacher's last move
    with pytest.raises(RoomError):
        store.results(room.code, room.secret)
    assert store.points(room.code) == []


def test_ending_asks_first_offers_the_export_and_the_export_works_after(closing):
    from specviz.ui import classroom as C

    ui, _ = _ui()
    st = C.on_load(ui, _client(), _request({"class": "new"}))[ui.room]
    room = C.ROOMS.get(st["code"])
    C.ROOMS.set_experiment(room.code, room.secret, "gamma")
    C.ROOMS.join(room.code, "a")
    C.ROOMS.post_point(room.code, "a", "race-0001", GOOD)
    asked = C.ask_close(ui, st)
    assert prop(asked[ui.confirm], "visible") is True and "export" in asked[ui.confirm_text]
    assert C.ROOMS.get(room.code) is room  # asking ends nothing
    out = C.close_class(ui, st, _request())
    ended = out[ui.room]
    assert ended["role"] == "ended" and C.ROOMS.get(room.code) is None
    assert 'data-state="ended"' in out[ui.card] and prop(out[ui.manage], "visible") is False
    files = C.export_points(ended)
    assert prop(files, "visible") is True and len(prop(files, "value")) == 2
    # a reload of the teacher's page: the ended class, read-only
    again = C.on_load(ui, _client("t" * 20, room.secret), _request({"class": room.code}))
    assert again[ui.room]["role"] == "ended" and 'data-state="ended"' in again[ui.card]
    assert C.set_experiment(ui, again[ui.room], "gamma")[ui.plot] is not None


def test_the_projected_card_is_large_and_holds_no_secret(closing):
    import re

    from specviz.ui import class_layout as CL
    from specviz.ui import classroom as C
    from specviz.ui.class_views import private_html, teacher_html

    room = C.ROOMS.create()
    closing.append(room)
    card = teacher_html(room, "http://h/")
    assert room.secret not in card and "<details" not in card and "<svg" in card
    assert room.secret in private_html(room, "http://h/")
    css = CL.CARD_CSS
    code = re.search(r"#sv-class-card \.sv-class-code \{[^}]*font: 700 (\d+)px", css)
    qr = re.search(r"#sv-class-card \.sv-class-qr svg \{ width: (\d+)px; height: (\d+)px", css)
    assert int(code.group(1)) >= 48 and int(qr.group(1)) >= 320 and int(qr.group(2)) >= 320


def test_a_point_carries_its_costs_in_standard_steps():
    """The point's c and v are the race's, as its headline measures them (theory.costs)."""
    from specviz.core.settings import DecodeSettings
    from specviz.models import TINY_PRESET, load_pair
    from specviz.serving.service import race, tokenize
    from specviz.theory.costs import race_costs
    from specviz.ui import class_views

    pair = load_pair(TINY_PRESET)
    done = list(race(tokenize(pair, "hello there", DecodeSettings.checked(max_new_tokens=12, gamma=3))))[-1]
    values = class_views.point_values(done.spec, done.std)
    rc = race_costs(done.spec, done.std)
    assert values["v"] == pytest.approx(rc.v) and values["c"] == pytest.approx(rc.c)
    assert R.check_point(values)["v"] == pytest.approx(rc.v)
