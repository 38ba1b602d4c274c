"""The py-spy stack classifier of ``ops.bench.cpu_profile``: waiting threads are dropped,
the leaf-most known frame decides, the event loop only when no other frame is known."""

from __future__ import annotations

from ops.bench.cpu_profile import CATEGORIES, category, classify, idle, python_thread

LOOP = "run (uvloop/__init__.py:105);_run_once (asyncio/base_events.py:1922)"


def test_the_leaf_most_known_frame_decides() -> None:
    tok = f"{LOOP};route (/w/router/core.py:80);encode (/w/router/tokenization.py:40)"
    assert category(tok) == "prompt side"
    span = f"{tok};start_span (site-packages/opentelemetry/sdk/trace/__init__.py:9)"
    assert category(span) == "tracing (OTel)"
    frames = (f"{LOOP};relay (/w/router/loopback_stream.py:70);"
              "readexactly (asyncio/streams.py:750)")
    assert category(frames) == "per-token streaming"
    assert category(f"{LOOP};send (site-packages/uvicorn/protocols/http/h11_impl.py:4)") \
        == "HTTP/ASGI (uvicorn, starlette)"
    serve = f"{LOOP};_choose (site-packages/ray/serve/_private/request_router/request_router.py:9)"
    assert category(serve) == "Serve hops (gRPC, handle, replica)"  # not kvroute's router/
    assert category(f"{tok};gc_collect_main (libpython3.11.so.1.0)") == "garbage collection"


def test_loop_only_and_native_only() -> None:
    assert category(LOOP) == "event loop"
    assert category("0x7f (libc.so.6);write (libc.so.6)") == "native, no Python frame"
    assert category("f (/w/thing.py:1)") == "other"


def test_waiting_threads_are_not_busy() -> None:
    assert idle(["uv_run (core.c:464)", "epoll_pwait (libc.so.6)"])
    assert idle(["_queue_SimpleQueue_get_impl (_queuemodule.c:253)",
                 "PyThread_acquire_lock_timed (libpython3.11.so.1.0)", "0x7f0d (libc.so.6)"])
    assert not idle(["UVStream__try_write (loop.c:106818)", "write (libc.so.6)"])
    raw = f"{LOOP};epoll_wait (libc.so.6) 50\n{LOOP} 7\nf (/w/thing.py:1) 3\n\n"
    got = classify(raw)
    assert got == {"event loop": 7, "other": 3} and set(got) <= set(CATEGORIES)


def test_python_threads_by_name() -> None:
    assert python_thread("ray::IDLE") and python_thread("ray::ServeRepli")
    assert not python_thread("event_engine") and not python_thread("worker.io")
