"""The field rule, written once: every request field of every API is honoured on every
engine, refused with a 400 naming it, or (when it cannot change the output) accepted and
ignored; a field no API defines is ignored, as vLLM does, logged once and counted.

``REGISTRY`` classifies each known field per API (``chat``, ``completions``, ``messages``,
``responses``); a dotted name is a field inside an object. Each request schema runs
``check`` on its raw body before validating it (``Checked``), so a refused field is a 400
whatever the schema holds, and an unknown one is counted in
``kvroute_ignored_fields_total{api,field}``. A refused field is refused only when it asks
for something: its ``off`` values (``null``, and the field's no-op values, such as
``n: 1`` or ``logprobs: false``, which clients send routinely) are accepted.

docs/api.md's field table is ``table()``'s output
(``tests/router/api/common/test_fields.py`` checks they agree).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator

from router import metrics
from router.api.common.field_table import API_FIELDS, HARMLESS, HONOURED, NO_EFFECT, REFUSED
from router.errors import ApiError

__all__ = ["HARMLESS", "HONOURED", "NO_EFFECT", "REFUSED", "Checked", "Rule", "check", "table"]
log = logging.getLogger(__name__)
ENGINES = ("mlx", "vllm", "sim")
MAX_FIELD_CHARS = 64  # an unknown field's name as a label, clipped
MAX_FIELDS_PER_API = 64  # distinct unknown names counted per API; the rest are OTHER
OTHER = "_other"


def _same(value: Any, off: Any) -> bool:
    if isinstance(value, bool) or isinstance(off, bool):
        return value is off
    number = (int, float)
    if isinstance(value, number) and isinstance(off, number):
        return value == off
    return type(value) is type(off) and value == off


@dataclass(frozen=True, slots=True)
class Rule:
    """How one API takes one field. ``off``: the values of a refused field that ask for
    nothing (``None`` always), or a predicate over the raw value. ``sim``: the emulator's
    cell when it differs from the status (``NO_EFFECT``: accepted, no effect on its
    synthetic text)."""

    status: str
    off: tuple[Any, ...] | Callable[[Any], bool] = ()
    sim: str | None = None
    note: str = ""

    def asks(self, value: Any) -> bool:
        """Whether ``value`` asks for something (for a refused field: a 400)."""
        if value is None:
            return False
        if callable(self.off):
            return not self.off(value)
        return not any(_same(value, o) for o in self.off)

    def cells(self) -> dict[str, str]:
        return {e: (self.sim if e == "sim" and self.sim else self.status) for e in ENGINES}


REGISTRY: dict[str, dict[str, Rule]] = {
    api: {name: Rule(*spec) for name, spec in table.items()} for api, table in API_FIELDS.items()
}


def refusal(name: str, rule: Rule) -> ApiError:
    why = "not supported by kvroute"
    if rule.note:
        why = f"{why} ({rule.note})"
    return ApiError(400, f"{name}: {why}", "unsupported_field", name)


class _Unknown:
    """Unknown field names per API: logged once each, counted with a bounded label."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def note(self, api: str, name: str) -> None:
        label = name[:MAX_FIELD_CHARS]
        with self._lock:
            seen = self._seen.setdefault(api, set())
            first = label not in seen
            if first and len(seen) >= MAX_FIELDS_PER_API:
                label, first = OTHER, OTHER not in seen
            if first:
                seen.add(label)
        if first:
            log.warning("%s: ignoring the unknown request field %r (counted in "
                        "kvroute_ignored_fields_total)", api, label)
        metrics.IGNORED_FIELDS.labels(api, label).inc()


UNKNOWN = _Unknown()


def check(api: str, data: Any, also_honoured: frozenset[str] = frozenset()) -> Any:
    """``data`` (a raw body) as it is, after the rule: a refused field that asks for
    something is a 400 naming it; an unknown top-level field is counted and ignored."""
    if not isinstance(data, dict):
        return data
    table = REGISTRY[api]
    for name, value in data.items():
        if not isinstance(name, str):
            continue
        rule = table.get(name)
        if rule is None:
            if name not in also_honoured:
                UNKNOWN.note(api, name)
        elif rule.status == REFUSED and name not in also_honoured and rule.asks(value):
            raise refusal(name, rule)
    for path, rule in _NESTED[api]:
        parent, child = path.split(".", 1)
        inner = data.get(parent)
        if isinstance(inner, dict) and rule.asks(inner.get(child)):
            raise refusal(path, rule)
    return data


_NESTED = {api: [(n, r) for n, r in t.items() if "." in n and r.status == REFUSED]
           for api, t in REGISTRY.items()}


class Checked(BaseModel):
    """A request schema under the field rule. ``field_api``: its registry entry;
    ``also_honoured``: fields this schema honours beyond the API's (the replicas' own
    endpoint's vLLM extras)."""

    field_api: ClassVar[str]
    also_honoured: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _field_rule(cls, data: Any) -> Any:
        return check(cls.field_api, data, cls.also_honoured)


def table() -> str:
    """docs/api.md's field table: field x API x engine, and the notes."""
    apis = list(REGISTRY)
    names = sorted({n for t in REGISTRY.values() for n in t})
    rows = ["| field | " + " | ".join(apis) + " | notes |", "|" + "---|" * (len(apis) + 2)]
    for name in names:
        rules = [REGISTRY[api].get(name) for api in apis]
        notes = dict.fromkeys(r.note for r in rules if r is not None and r.note)
        cells = " | ".join(_cell(r) for r in rules)
        rows.append(f"| `{name}` | {cells} | {' '.join(notes)} |")
    return "\n".join(rows) + "\n"


def _cell(rule: Rule | None) -> str:
    """One API's cell: the status on mlx and vllm, and the emulator's when it differs."""
    if rule is None:
        return "-"
    cells = rule.cells()
    if cells["sim"] == cells["mlx"]:
        return cells["mlx"]
    return f"{cells['mlx']} (sim: {cells['sim']})"


if __name__ == "__main__":  # docs/api.md's table
    print(table(), end="")
