"""The app behind Serve's proxy on real Serve, now that router replicas listen themselves by
default: with ``server.ingress: proxy``, and with ``auto`` on the port Serve's proxy already
holds (as under ``serve deploy``), which must resolve to the proxy: resolved to direct, the
router replicas could not bind that port and the app would never become healthy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import IndexConfig, KvrouteConfig, ServerConfig
from tests.stacks import deployed, proxy_port, sim_model

pytestmark = pytest.mark.slow
MODEL = "proxy-sim"
BODY = {"model": MODEL, "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "Through the proxy. " * 20}]}


@pytest.fixture(scope="module", params=["proxy", "auto"])
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path) -> Iterator[str]:
    cfg = KvrouteConfig(models=[sim_model(MODEL, tiny_model_dir)], index=IndexConfig(),
                        server=ServerConfig(host="127.0.0.1", port=proxy_port(),
                                            ingress=request.param))
    with deployed(cfg) as url:
        assert url.endswith(f":{proxy_port()}")
        yield url


def test_answers_stream_and_ids_pass_through_the_proxy(stack: str) -> None:
    r = httpx.post(f"{stack}/v1/chat/completions", json=BODY, timeout=60,
                   headers={"x-request-id": "via-proxy-1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "via-proxy-1"
    assert r.json()["id"] == "chatcmpl-via-proxy-1"  # the API's prefix on the request id
    text = r.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{stack}/v1/chat/completions", json={**BODY, "stream": True},
                      timeout=60) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    streamed = "".join(c["delta"].get("content") or "" for line in lines[:-1]
                       for c in json.loads(line[6:]).get("choices", []))
    assert text and streamed == text
    m = httpx.post(f"{stack}/v1/messages", json=BODY, timeout=60)
    assert m.status_code == 200 and m.json()["type"] == "message", m.text
