"""An attendee's poll waits for the teacher's next move (specviz.ui.room_wait): woken at once from another thread,
back empty-handed after its hold, never missing a move made before it listened, and leaving nothing behind."""

from __future__ import annotations

import asyncio
import threading
import time

from specviz.ui import room_wait


def test_a_move_from_another_thread_wakes_the_waiting_polls_at_once():
    async def main():
        polls = [asyncio.create_task(room_wait.until_moved("abc", lambda: False, timeout=5)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert room_wait.waiting("abc") == 3
        t0 = time.monotonic()
        threading.Timer(0.1, room_wait.moved, args=("abc",)).start()  # (the teacher's step: a worker thread)
        assert await asyncio.gather(*polls) == [True, True, True]
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2
    assert room_wait.waiting("abc") == 0


def test_a_poll_returns_after_its_hold_and_sees_a_move_made_before_it_listened():
    async def main():
        t0 = time.monotonic()
        quiet = await room_wait.until_moved("q", lambda: False, timeout=0.2)
        held = time.monotonic() - t0
        room_wait.moved("other")  # another room's move wakes nobody here
        early = await room_wait.until_moved("q", lambda: True, timeout=5)
        return quiet, held, early

    quiet, held, early = asyncio.run(main())
    assert quiet is False and held >= 0.19 and early is True
    assert room_wait.waiting("q") == 0
