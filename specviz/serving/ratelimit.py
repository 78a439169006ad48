"""Log lines a client can cause, rate-limited: a refused value costs at most one line, and a flood of them a
handful a minute plus one line saying how many were left out (issue 62)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable


class RateLimit:
    """At most ``burst`` log lines a ``period_s``, then one line saying how many were left out (issue 62: every
    wrong teacher secret wrote a WARNING line, unlimited)."""

    def __init__(self, burst: int = 10, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.burst, self.period_s, self.clock = burst, period_s, clock
        self._start, self._n, self._left_out = -math.inf, 0, 0
        self._lock = threading.Lock()

    def warn(self, logger: logging.Logger, msg: str, *args: Any) -> bool:
        with self._lock:
            now = self.clock()
            if now - self._start >= self.period_s:
                if self._left_out:
                    logger.warning("%d more such lines left out in the last %.0f s", self._left_out, self.period_s)
                self._start, self._n, self._left_out = now, 0, 0
            self._n += 1
            if self._n > self.burst:
                self._left_out += 1
                return False
        logger.warning(msg, *args)
        return True
