"""The plugin interface and registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

from router.context import RequestContext


class Scorer(Protocol):
    """Scores every candidate in [0, 1]; higher is better. The pipeline weights it."""

    name: ClassVar[str]

    def score(self, ctx: RequestContext) -> list[float]: ...


PLUGINS: dict[str, type[Scorer]] = {}


def register(name: str) -> Callable[[type[Scorer]], type[Scorer]]:
    def deco(cls: type[Scorer]) -> type[Scorer]:
        if name in PLUGINS:
            raise ValueError(f"plugin {name!r} registered twice")
        cls.name = name
        PLUGINS[name] = cls
        return cls

    return deco
