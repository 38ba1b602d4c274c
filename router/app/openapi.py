"""kvroute's OpenAPI document, with request bodies and error responses.

The routes read their bodies by hand (``router.api.common.request.parse_body``: one size
check, one ``json.loads``, errors in each API's own shape), so FastAPI's
generated document has no request-body schemas. ``kvroute_openapi`` starts from
FastAPI's document and adds, for the POST routes:

- ``requestBody``: the pydantic request model's JSON schema (validation mode,
  field aliases), with every nested model in ``components/schemas`` and every
  ``$ref`` pointing there;
- ``200`` as JSON or, with ``stream: true``, ``text/event-stream``;
- the error statuses the route can answer (400, 401, 404, 413, 429, 500, 503),
  in the API's own error shape (``OpenAIError`` or ``AnthropicError``).

It also documents the GET routes' real content types (``/metrics`` is Prometheus
text) and the optional API-key schemes (``Authorization: Bearer`` or
``x-api-key``; only enforced when keys are configured).

Wire it in once, before ``@serve.ingress(app)`` (Serve pickles the app there):
``app.openapi = lambda: kvroute_openapi(app)``. The document is served at
``/openapi.json`` through the Serve proxy like any other route.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from router.api.anthropic.schema import CountTokensRequest, MessagesRequest
from router.api.openai.schema import ChatCompletionRequest, CompletionRequest
from router.api.openai.tokenize import DetokenizeRequest, TokenizeRequest
from router.api.responses.schema import ResponsesRequest
from router.errors import _ANTHROPIC_TYPES, _OPENAI_TYPES

__all__ = ["BODIES", "kvroute_openapi"]

REF = "#/components/schemas/{model}"
# path → (request model, error shape component)
BODIES: dict[str, tuple[type[BaseModel], str]] = {
    "/v1/chat/completions": (ChatCompletionRequest, "OpenAIError"),
    "/v1/completions": (CompletionRequest, "OpenAIError"),
    "/v1/responses": (ResponsesRequest, "OpenAIError"),
    "/v1/messages": (MessagesRequest, "AnthropicError"),
    "/v1/messages/count_tokens": (CountTokensRequest, "AnthropicError"),
    "/tokenize": (TokenizeRequest, "OpenAIError"),
    "/detokenize": (DetokenizeRequest, "OpenAIError"),
}
_ERRORS = {
    400: "Invalid request: malformed JSON, schema violation, bad token ids, unsupported "
         "content, a conversation the chat template cannot render, a prompt that alone "
         "exceeds the context window (code context_length_exceeded).",
    401: "Missing or wrong API key (only when API keys are configured).",
    404: "Unknown model or group; on /v1/responses also an unknown or expired "
         "previous_response_id.",
    413: "Body over the byte limit (a prompt plus output limit over the context window "
         "is not an error: the output limit is cut to fit, x-kvroute-max-tokens-cut).",
    429: "Rate-limited; see the retry-after header.",
    500: "Internal error in the router (a bug: please report it).",
    503: "Overloaded or no ready replica; see the retry-after header.",
}
_COUNT_ERRORS = (400, 401, 404, 413, 429, 500)  # counting generates nothing: no 503
_COUNTING = ("/count_tokens", "/tokenize", "/detokenize")
_SECURITY = [{}, {"bearerAuth": []}, {"apiKeyHeader": []}]


def _error_schemas() -> dict[str, Any]:
    nullable = {"type": ["string", "null"]}
    openai = {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"},
                           "type": {"type": "string", "enum": sorted(set(_OPENAI_TYPES.values()))},
                           "param": nullable, "code": nullable},
        }},
    }
    anthropic = {
        "type": "object", "required": ["type", "error"],
        "properties": {
            "type": {"type": "string", "const": "error"},
            "error": {"type": "object", "required": ["type", "message"],
                      "properties": {"type": {"type": "string",
                                              "enum": sorted(set(_ANTHROPIC_TYPES.values()))},
                                     "message": {"type": "string"}}},
        },
    }
    return {"OpenAIError": openai, "AnthropicError": anthropic}


def _request_schemas() -> tuple[dict[type[BaseModel], dict[str, Any]], dict[str, Any]]:
    """Request models → their ``$ref``, and every schema they need, by component name."""
    models = list(dict.fromkeys(model for model, _ in BODIES.values()))
    refs, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    return {m: refs[(m, "validation")] for m in models}, top.get("$defs", {})


def _error_response(status: int, shape: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": _ERRORS[status],
        "content": {"application/json": {"schema": {"$ref": REF.format(model=shape)}}},
    }
    if status in (429, 503):
        out["headers"] = {"retry-after": {"description": "Seconds to wait before retrying.",
                                          "schema": {"type": "string"}}}
    return out


def _success(path: str) -> dict[str, Any]:
    if path in ("/tokenize", "/detokenize"):
        return {"description": "vLLM's TokenizeResponse / DetokenizeResponse.",
                "content": {"application/json": {"schema": {"type": "object"}}}}
    if path.endswith("/count_tokens"):
        schema = {"type": "object", "required": ["input_tokens"],
                  "properties": {"input_tokens": {"type": "integer", "minimum": 0}}}
        return {"description": "The prompt's token count.",
                "content": {"application/json": {"schema": schema}}}
    # OpenAPI 3.1: an event stream's ``schema`` describes ONE event (3.2 has itemSchema)
    event = {"type": "object", "required": ["data"], "properties": {
        "event": {"type": "string", "description": "Anthropic: the event's type."},
        "data": {"type": "string", "description": "One chunk or event as JSON; OpenAI "
                 "streams end with the literal [DONE]."}}}
    return {"description": "The reply: JSON, or server-sent events with stream: true.",
            "content": {"application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": event}}}


def _post_operation(op: dict[str, Any], path: str, ref: dict[str, Any], shape: str) -> None:
    op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    statuses = _COUNT_ERRORS if path.endswith(_COUNTING) else tuple(_ERRORS)
    op["responses"] = {"200": _success(path),
                       **{str(s): _error_response(s, shape) for s in statuses}}
    op["security"] = copy.deepcopy(_SECURITY)


def _get_operations(paths: dict[str, Any]) -> None:
    """Real content types and statuses of the GET routes."""
    if op := paths.get("/metrics", {}).get("get"):
        op["responses"] = {"200": {"description": "Prometheus text exposition.",
                                   "content": {"text/plain": {"schema": {"type": "string"}}}}}
    if op := paths.get("/health", {}).get("get"):
        body = {"application/json": {"schema": {"type": "object"}}}
        op["responses"] = {"200": {"description": "Every model has a ready replica.",
                                   "content": body},
                           "503": {"description": "Some model has no ready replica.",
                                   "content": copy.deepcopy(body)}}
    for path in ("/v1/models", "/v1/models/{model_id}"):
        if op := paths.get(path, {}).get("get"):
            op["responses"]["401"] = _error_response(401, "OpenAIError")
            op["security"] = copy.deepcopy(_SECURITY)
    if op := paths.get("/v1/models/{model_id}", {}).get("get"):
        op["responses"].pop("422", None)  # FastAPI's default: the router answers 404
        op["responses"]["404"] = _error_response(404, "OpenAIError")


def _merge(components: dict[str, Any], extra: dict[str, Any]) -> None:
    for name, schema in extra.items():
        if name in components and components[name] != schema:
            raise ValueError(f"OpenAPI component {name!r} is defined twice, differently")
        components[name] = schema


def kvroute_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document for ``app`` plus request bodies and error responses (cached)."""
    if app.openapi_schema is not None and _complete(app.openapi_schema):
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                      description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    refs, defs = _request_schemas()
    _merge(schemas, defs)
    _merge(schemas, _error_schemas())
    components["securitySchemes"] = {
        "bearerAuth": {"type": "http", "scheme": "bearer"},
        "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    paths = doc.setdefault("paths", {})
    for path, (model, shape) in BODIES.items():
        if op := paths.get(path, {}).get("post"):
            _post_operation(op, path, refs[model], shape)
    _get_operations(paths)
    app.openapi_schema = doc
    return doc


def _complete(doc: dict[str, Any]) -> bool:
    """Whether a cached document is ours (FastAPI's own has no request bodies)."""
    post = doc.get("paths", {}).get("/v1/chat/completions", {}).get("post", {})
    return "requestBody" in post
