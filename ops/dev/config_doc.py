"""Developer tool: docs/configuration.md's field tables, written from the config schema
(``deploy/config/``), so the page says what the schema says.

    python -m ops.dev.config_doc --write   # after changing a field
    python -m ops.dev.config_doc --check   # what tests/ops/dev/test_config_doc.py checks
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from deploy.config import KvrouteConfig
from deploy.config.model import MlxKwargs, SimKwargs

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
FIELDS, ENGINES = "## Fields\n", "## Engine options\n"
FIRST_ENGINE = "### `models[].engine_kwargs"


def tname(a: Any) -> str:
    o = typing.get_origin(a)
    if o in (typing.Union, types.UnionType):
        args = [x for x in typing.get_args(a) if x is not type(None)]
        s = " \\| ".join(tname(x) for x in args)
        return s + (" \\| null" if len(args) < len(typing.get_args(a)) else "")
    if o is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(a))
    if o in (list, tuple, set, frozenset):
        return f"list of {tname(typing.get_args(a)[0])}" if typing.get_args(a) else "list"
    if o is dict:
        k, v = typing.get_args(a)
        return f"map {tname(k)} → {tname(v)}"
    if isinstance(a, type) and issubclass(a, BaseModel):
        return a.__name__
    if isinstance(a, type) and issubclass(a, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in a)
    return getattr(a, "__name__", str(a)).replace("typing.", "")


def default(f: FieldInfo) -> str:
    if f.is_required():
        return "**required**"
    if f.default_factory is not None:
        try:
            d = f.default_factory()
        except TypeError:
            return "(computed)"
    else:
        d = f.default
    if isinstance(d, BaseModel):
        return (
            "(section defaults)"
            if type(d).__name__.endswith("Config")
            else f"`{flow(d.model_dump(exclude_defaults=True))}`"
        )
    if isinstance(d, list) and d and isinstance(d[0], BaseModel):
        return "`[" + ", ".join(flow(x.model_dump(exclude_defaults=True)) for x in d) + "]`"
    if d is None:
        return "null"
    if isinstance(d, enum.Enum):
        d = d.value
    if isinstance(d, bool):
        return "`true`" if d else "`false`"
    if d in ([], {}, ()):
        return "`[]`" if not isinstance(d, dict) else "`{}`"
    return f"`{d}`"


def flow(d: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def models_in(a: Any) -> list[type[BaseModel]]:
    if isinstance(a, type) and issubclass(a, BaseModel):
        return [a]
    out = []
    for x in typing.get_args(a):
        out += models_in(x)
    return out


def section(path: str, model: type[BaseModel], out: list[str], seen: set[type[BaseModel]]) -> None:
    rows, subs = [], []
    for n, f in model.model_fields.items():
        desc = (f.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{n}` | {tname(f.annotation)} | {default(f)} | {desc} |")
        for m in models_in(f.annotation):
            if m not in seen:
                seen.add(m)
                subs.append((f"{path}.{n}" if path else n, m))
    out.append(f"\n### `{path}`\n" if path else "\n### top level\n")
    doc = re.sub(r"\s+", " ", (model.__doc__ or "").strip().split("\n\n")[0])
    if doc and not doc.startswith("Usage docs"):
        out.append(doc + "\n")
    out.append("| field | type | default | meaning |\n|---|---|---|---|")
    out.extend(rows)
    for p, m in subs:
        section(p, m, out, seen)


def fields() -> str:
    out: list[str] = []
    section("", KvrouteConfig, out, {KvrouteConfig})
    return "\n".join(out) + "\n"


def engines() -> str:
    out: list[str] = []
    section("models[].engine_kwargs (engine: mlx)", MlxKwargs, out, {MlxKwargs})
    section("models[].engine_kwargs (engine: sim)", SimKwargs, out, {SimKwargs})
    return "\n".join(out).lstrip("\n") + "\n"


def render(text: str) -> str:
    """``text`` (the page) with its generated parts written anew; the prose stays."""
    head, rest = text.split(FIELDS, 1)
    _, tail = rest.split(ENGINES, 1)
    intro, _ = tail.split(FIRST_ENGINE, 1)
    return head + FIELDS + fields() + "\n" + ENGINES + intro + engines()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite docs/configuration.md")
    p.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = p.parse_args(argv)
    text = DOC.read_text()
    new = render(text)
    if args.write:
        DOC.write_text(new)
    elif args.check and new != text:
        sys.stderr.write("docs/configuration.md is stale: python -m ops.dev.config_doc --write\n")
        return 1
    elif not args.check:
        sys.stdout.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
