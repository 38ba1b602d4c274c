"""Plugin kinds and the registry.

A routing pipeline is filters → scorers → one picker (as in llm-d's inference
scheduler). Each plugin lives in its own module, registers under a stable
kebab-case name, and declares a pydantic ``Params`` model so its settings are
typed and validated with the rest of the config. A plugin that keeps state
(e.g. an approximate prefix tree) may define ``on_routed`` to learn from each
decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from router.routing.context import Candidate, RequestContext

Kind = Literal["filter", "scorer", "picker"]


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Plugin(Protocol):
    name: ClassVar[str]
    kind: ClassVar[Kind]
    Params: ClassVar[type[BaseModel]]

    def __init__(self, params: Any) -> None: ...


class Filter(Plugin, Protocol):
    def filter(self, ctx: RequestContext) -> list[Candidate]: ...


class Scorer(Plugin, Protocol):
    """Scores every candidate in [0, 1]; higher is better. The pipeline weights it."""

    def score(self, ctx: RequestContext) -> list[float]: ...


class Picker(Plugin, Protocol):
    """Ranks candidates (best first) from the weighted total scores."""

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]: ...


PLUGINS: dict[str, type[Any]] = {}
P = TypeVar("P")


def register(name: str, kind: Kind) -> Callable[[type[P]], type[P]]:
    def deco(cls: type[P]) -> type[P]:
        if name in PLUGINS:
            raise ValueError(f"plugin {name!r} registered twice")
        cls.name = name  # type: ignore[attr-defined]
        cls.kind = kind  # type: ignore[attr-defined]
        if not hasattr(cls, "Params"):
            cls.Params = NoParams  # type: ignore[attr-defined]
        PLUGINS[name] = cls
        return cls

    return deco


def make_plugin(name: str, kind: Kind, params: dict[str, Any] | None = None) -> Any:
    cls = PLUGINS.get(name)
    if cls is None or cls.kind != kind:
        known = sorted(n for n, c in PLUGINS.items() if c.kind == kind)
        raise ValueError(f"unknown {kind} {name!r}; known {kind}s: {known}")
    return cls(cls.Params.model_validate(params or {}))
