"""Errors in each API's own JSON shape, with the right HTTP status."""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "service_unavailable",
}


MAX_ECHO_CHARS = 200  # one client string quoted in an error message
MAX_MESSAGE_CHARS = 2000  # a whole error message, whatever it quotes
MAX_PARAM_CHARS = 200


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """A client's string as an error may quote it: at most ``limit`` characters (a model
    name, a tool name or an id can be as long as the body allows)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class ApiError(Exception):
    """An error reply. Its message and param are clipped (``clip``): a message that
    quotes a client's string never echoes more than a bounded part of it."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        message = clip(message, MAX_MESSAGE_CHARS)
        param = None if param is None else clip(param, MAX_PARAM_CHARS)
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after_s = retry_after_s


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def _headers(err: ApiError) -> dict[str, str]:
    if err.retry_after_s is None:
        return {}
    return {"retry-after": str(max(1, math.ceil(err.retry_after_s)))}


def anthropic_error(err: ApiError) -> JSONResponse:
    body = {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPES.get(err.status, "api_error"), "message": err.message},
    }
    return JSONResponse(body, status_code=err.status, headers=_headers(err))


def error_response(err: ApiError, path: str) -> JSONResponse:
    """The API's own error shape: Anthropic's on /v1/messages*, OpenAI's elsewhere."""
    return anthropic_error(err) if path.startswith("/v1/messages") else openai_error(err)


def openai_error(err: ApiError) -> JSONResponse:
    body = {
        "error": {
            "message": err.message,
            "type": _OPENAI_TYPES.get(err.status, "api_error"),
            "param": err.param,
            "code": err.code,
        }
    }
    return JSONResponse(body, status_code=err.status, headers=_headers(err))
