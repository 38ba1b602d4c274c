"""/v1/models and /v1/models/{id}: what a client may name, as OpenAI model objects.

Models, groups and aliases are all listed, each with ``kind`` (``model``, ``group`` or
``alias``); an alias also says what it stands for in ``alias_of`` and ``parent`` (vLLM's
field for what a served name derives from). ``max_model_len`` (vLLM's and SGLang's
field, which agent clients read to size their context) is the context window; a group's
is its smallest member's, since any member may serve it. An alias is a pattern
(``claude-*``): retrieving a name it matches gives that name's object, as a request with
it would be served.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from deploy.config import KvrouteConfig
from router.core import RouterCore
from router.errors import ApiError, clip

AUTO = "auto"


def _card(name: str, kind: str, window: int, root: str,
          alias_of: str | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "kvroute",
                            "max_model_len": window, "root": root, "parent": alias_of,
                            "kind": kind}
    if alias_of is not None:
        card["alias_of"] = alias_of
    return card


def _windows(core: RouterCore) -> dict[str, int]:
    """Each name's window: models, groups and ``auto`` (any model may serve it)."""
    windows = core.targets.windows()
    models = [m.name for m in core.targets.config.models]
    return windows | {AUTO: min(windows[m] for m in models)}


def _root(config: KvrouteConfig, name: str) -> str:
    model = config.model(name)
    return model.model_path if model is not None else name


def _alias_card(core: RouterCore, name: str, target: str) -> dict[str, Any]:
    config = core.targets.config
    return _card(name, "alias", _windows(core)[target], _root(config, target), target)


def list_models(core: RouterCore) -> dict[str, Any]:
    """Models, then groups, then aliases (patterns as configured)."""
    config, windows = core.targets.config, _windows(core)
    data = [_card(m.name, "model", windows[m.name], m.model_path) for m in config.models]
    data += [_card(g.name, "group", windows[g.name], g.name) for g in config.groups]
    data += [_alias_card(core, pattern, target) for pattern, target in config.aliases.items()]
    return {"object": "list", "data": data}


def retrieve_model(core: RouterCore, name: str) -> dict[str, Any]:
    """One model object (the OpenAI SDK's ``models.retrieve``); 404 if no request with
    ``name`` would be served."""
    config = core.targets.config
    if config.model(name) is not None:
        return _card(name, "model", _windows(core)[name], _root(config, name))
    if any(g.name == name for g in config.groups):
        return _card(name, "group", _windows(core)[name], name)
    if name == AUTO:
        return _card(name, "group", _windows(core)[name], name)
    target = next((t for p, t in config.aliases.items() if fnmatch.fnmatchcase(name, p)), None)
    if target is None:
        raise ApiError(404, f"model {clip(name)!r} does not exist", "model_not_found", "model")
    return _alias_card(core, name, target)
