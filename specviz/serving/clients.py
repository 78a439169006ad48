"""Who a request comes from, for the per-client limits (rooms, seats, runs): the client's network address.

A page, a gradio_client script and a raw HTTP client all reach Gradio with a ``gr.Request`` whose ``client.host``
is the address the connection came from.  Behind a reverse proxy (a Hugging Face Space, nginx) that is the proxy's
address for every visitor, so there the first address of ``X-Forwarded-For`` names the client instead: read it when
``SPECVIZ_TRUST_PROXY=1`` (default: on when ``SPACE_ID`` is set, i.e. on a Space, whose proxy sets the header;
off elsewhere, where anyone could forge it).  Visitors behind one NAT (a workshop's Wi-Fi) share an address: the
limits keyed by it are fair shares that reclaim what holds nothing, not hard caps on a class (serving.rooms).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

UNKNOWN = "unknown"


def trust_proxy() -> bool:
    value = os.environ.get("SPECVIZ_TRUST_PROXY")
    if value is None:
        return bool(os.environ.get("SPACE_ID"))
    return value.strip().lower() in ("1", "true", "yes", "on")


def _address(text: Any) -> str | None:
    """A valid IP address in ``text`` (normalised), else None."""
    if not isinstance(text, str):
        return None
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return None


def client_key(request: Any) -> str:
    """The client's address for this request ("unknown" outside a request: scripts, tests)."""
    if request is None:
        return UNKNOWN
    if trust_proxy():
        headers = getattr(request, "headers", None)
        forwarded = headers.get("x-forwarded-for") if headers is not None else None
        if isinstance(forwarded, str) and forwarded:
            first = _address(forwarded.split(",")[0])
            if first:
                return first
    client = getattr(request, "client", None)
    host = getattr(client, "host", None) if client is not None else None
    return _address(host) or (host if isinstance(host, str) and host and len(host) <= 64 else UNKNOWN)
