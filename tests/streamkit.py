"""A stand-in OpenAI-compatible server for the serve runner's attach mode: real HTTP (aiohttp, in a
thread of the test's process), streaming each completion as the test scripts it.

vLLM's server merges tokens into one chunk when its client falls behind, which a test cannot make
it do on cue; this server sends the chunks a test names (how many tokens each, at which times after
the request came), so that what the client records of a multi-token chunk can be checked exactly.
Its ``/metrics`` carries a ``vllm:cache_config_info`` line when given one (what the server runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Script:
    """What the server answers: ``chunks`` as (seconds after the request, tokens) pairs; ``raw``,
    when given, is sent as the one streamed message instead (a broken stream)."""

    chunks: Sequence[tuple[float, int]] = ((0.0, 1),)
    raw: bytes | None = None
    cache_config: dict[str, str] | None = None
    requests: list[dict] = field(default_factory=list)


def _app(script: Script) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stand-in"}]})

    async def metrics(request: web.Request) -> web.Response:
        lines = ["# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 0.0"]
        if script.cache_config is not None:
            labels = ",".join(f'{k}="{v}"' for k, v in script.cache_config.items())
            lines.append(f"vllm:cache_config_info{{{labels}}} 1.0")
        return web.Response(text="\n".join(lines) + "\n")

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        script.requests.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if script.raw is not None:
            await resp.write(b"data: " + script.raw + b"\n\n")
        else:
            left = int(body["max_tokens"])
            for i, (at, tokens) in enumerate(script.chunks):
                await asyncio.sleep(max(0.0, start + at - loop.time()))
                tokens = min(tokens, left)
                left -= tokens
                last = i == len(script.chunks) - 1 or left == 0
                choice = {"index": 0, "text": "x" * tokens, "token_ids": [7] * tokens}
                choice["finish_reason"] = "length" if last else None
                await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                if last:
                    break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


@contextlib.contextmanager
def stand_in_server(script: Script) -> Iterator[str]:
    """Serve ``script`` on 127.0.0.1 at a free port for the block; yields the base URL."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, object] = {}

    async def start() -> None:
        runner = web.AppRunner(_app(script))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10), "the stand-in server did not start"
    try:
        yield f"http://127.0.0.1:{holder['port']}"
    finally:
        runner = holder["runner"]
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
