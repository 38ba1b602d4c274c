"""Requests still reading their body, bounded per key.

A request holds a router slot (the direct listener's ``max_open``, Serve's
``max_ongoing_requests`` behind the proxy) from its headers on, so a key that opens many
requests and trickles their bodies could take every slot for the body deadline, and
another key's requests would get 503 or wait. Each router replica therefore lets one
owner (a key's name; with keys off, the client's address) read at most
``server.max_body_waits_per_key`` bodies at once; the next is a fast 429 before a byte
of its body is read, so it frees its slot at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from router.auth.keys import ApiKeyConfig
from router.errors import ApiError


def body_owner(key: ApiKeyConfig | None, client_host: str | None) -> str:
    """Whose body this is: the key's name, else the client's address."""
    if key is not None:
        return f"key:{key.name}"
    return f"addr:{client_host}" if client_host else "anonymous"


class BodyWaits:
    """How many requests of each owner are reading their body now (``limit`` at most;
    0: no bound)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting: dict[str, int] = {}

    @contextmanager
    def hold(self, owner: str) -> Iterator[None]:
        now = self.waiting.get(owner, 0)
        if self.limit and now >= self.limit:
            raise ApiError(429, f"{now} requests of this key are still sending their bodies "
                           f"to this router replica (at most {self.limit}); finish or close "
                           "them first", "too_many_pending_bodies", retry_after_s=1.0)
        self.waiting[owner] = now + 1
        try:
            yield
        finally:
            left = self.waiting[owner] - 1
            if left:
                self.waiting[owner] = left
            else:
                del self.waiting[owner]
