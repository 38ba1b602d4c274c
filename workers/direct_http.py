"""A replica's own OpenAI endpoint on loopback, bypassing the router (stub).

Being built for `kvroute bench compare` (issue 9): other routers such as
sglang-router are pointed at these endpoints, so every router drives the same
replicas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

Generate = Callable[..., AsyncIterator[dict[str, Any]]]


class DirectHttp:
    def __init__(self, model: str, model_path: str, generate: Generate,
                 host: str = "127.0.0.1") -> None:
        self.model, self.model_path, self._generate, self.host = model, model_path, generate, host
        self.address: str | None = None

    async def start(self) -> None:
        raise NotImplementedError("direct_http is not available yet")

    async def stop(self) -> None:
        return None
