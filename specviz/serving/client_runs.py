"""One client, a bounded share of the models: at most `RUNS_PER_CLIENT` live runs per client address waiting for
the models or holding them (issue 62: twelve /trace calls from one address filled the live gate's queue, and
every other visitor was told to retry in minutes).

A client is its address (serving.clients: the connection's, or on a Space the one its proxy says).  A loopback
address is not limited: it is the host itself, or a proxy on the host that did not say whom it forwards
(uvicorn takes X-Forwarded-For from 127.0.0.1), so no two clients behind it could be told apart, and limiting it
would limit everyone.  Only live runs count: a replay from the recording cache, or a run following an identical
one in progress, takes no model time and is never refused here.  Beyond the limit a run is refused at once with
`ClientBusy` (a `Busy`: the page and the API show its message).

The default, 4 (SPECVIZ_RUNS_PER_CLIENT), is half the live gate's queue (SPECVIZ_MAX_WAITING, 8): one address
can never fill it, and a classroom behind one NAT, which is one address here, still gets four live runs going
at once (its replays of the examples unlimited); a host teaching behind one address may raise it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
from typing import Iterator

from .clients import UNKNOWN
from .envvars import env_int
from .replay import Busy

log = logging.getLogger("specviz.client_runs")
RUNS_PER_CLIENT = env_int("SPECVIZ_RUNS_PER_CLIENT", 4)


class ClientBusy(Busy):
    """This client already has its share of live runs going."""

    def __init__(self, limit: int, retry_s: float = 10.0):
        self.limit = limit
        self.retry_s, self.ahead = max(1, round(retry_s)), limit
        what = "a run in progress" if limit == 1 else f"{limit} runs in progress from this address"
        one = "it" if limit == 1 else "one"
        RuntimeError.__init__(self, f"You already have {what}; wait for {one} to finish (or stop it), then run "
                                    "again. Replays of the page's examples are not limited.")


class ClientRuns:
    """Live runs per client address, at most `limit` each."""

    def __init__(self, limit: int | None = None):
        self.limit = limit or RUNS_PER_CLIENT
        self._runs: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, client: str | None, retry_s: float = 10.0) -> Iterator[None]:
        """One live run of ``client`` while the block runs (None or "unknown", a run from Python, or a loopback
        address: never limited); ClientBusy when the client already has `limit` of them."""
        if not client or client == UNKNOWN or loopback(client):
            yield
            return
        with self._lock:
            n = self._runs.get(client, 0)
            if n >= self.limit:
                log.info("a live run was refused: its client already has %d in progress", n)
                raise ClientBusy(self.limit, retry_s)
            self._runs[client] = n + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._runs.get(client, 1) - 1
                if left > 0:
                    self._runs[client] = left
                else:
                    self._runs.pop(client, None)

    def count(self, client: str) -> int:
        with self._lock:
            return self._runs.get(client, 0)

    def __len__(self) -> int:
        return len(self._runs)


def loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


CLIENT_RUNS = ClientRuns()
