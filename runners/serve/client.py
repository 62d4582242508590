"""kvbench's load generator for an OpenAI-compatible server: an open-loop replay of a workload
over HTTP (aiohttp, the client library vLLM itself depends on).

Every request is sent at its arrival time (measured from the replay's start, whatever the
server is doing: open loop) to ``/v1/completions`` with the exact prompt token ids,
``max_tokens`` = ``min_tokens`` = its output length, ``ignore_eos``, its ``n`` samples
(greedy for one sample; for several, temperature 1 with a fixed seed, since vLLM refuses greedy
sampling with ``n`` > 1: the lengths do not depend on it), streamed with usage. Per sample it
records the send time, the time of every chunk that carried tokens (the first is the first
token) and how many tokens each carried, and the end time: a chunk is one arrival, however many
tokens it holds, as ``vllm bench serve``'s client times one ITL per chunk
(``vllm/benchmarks/lib/endpoint_request_func.py``), and vLLM's server merges tokens into one
chunk when its client falls behind. A message that is not a JSON object is a broken stream, named
with the server's URL; a request the server refuses (an
HTTP error), or one whose stream breaks or ends short, is kept with its status and the reason,
never dropped from the record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from .scheduler import REQUEST_ID_PREFIX

FINISHED = "finished"  # the requests table's status values
REJECTED = "rejected"  # the server answered with an HTTP error
DROPPED = "dropped"  # the stream broke, timed out, or ended before every token came


@dataclasses.dataclass(frozen=True)
class ClientRequest:
    """One request to send: kvbench's id, its prompt, its output length, samples and arrival."""

    request_id: int
    prompt_ids: tuple[int, ...]
    output_len: int
    n: int
    arrival_s: float


@dataclasses.dataclass
class SampleResult:
    """What the client saw of one sample of one request (times in seconds from the replay start)."""

    request_id: int
    sample: int
    sent_s: float = float("nan")
    chunk_times: list[float] = dataclasses.field(default_factory=list)  # each chunk that carried tokens
    chunk_tokens: list[int] = dataclasses.field(default_factory=list)  # how many tokens each carried
    end_s: float = float("nan")
    status: str = DROPPED
    error: str | None = None

    @property
    def tokens(self) -> int:
        return sum(self.chunk_tokens)


class BrokenStream(ValueError):
    """A streamed message that is not an OpenAI completion chunk (its text names the server)."""


def _choices(url: str, data: bytes) -> list[dict[str, Any]]:
    """The choices of one streamed message (``data: {...}``); ``BrokenStream`` when it is not a
    completion chunk: a JSON object whose ``choices``, if any, is a list of objects."""
    try:
        chunk = json.loads(data)
    except ValueError:
        raise BrokenStream(f"{url} streamed a message that is not JSON: {data[:80]!r}") from None
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(chunk, dict) or not isinstance(choices, (list, type(None))):
        raise BrokenStream(f"{url} streamed a message that is not a completion chunk: {data[:80]!r}")
    for c in choices or ():
        index = c.get("index", 0) if isinstance(c, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            raise BrokenStream(f"{url} streamed a choice that is not a completion choice: {data[:80]!r}")
    return list(choices or ())


def request_body(model: str, req: ClientRequest) -> dict[str, Any]:
    """The ``/v1/completions`` body for one request."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(req.prompt_ids),
        "max_tokens": req.output_len,
        "min_tokens": req.output_len,
        "ignore_eos": True,
        "n": req.n,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "request_id": f"{REQUEST_ID_PREFIX}{req.request_id}",
    }
    if req.n > 1:
        body.update(temperature=1.0, seed=req.request_id)
    else:
        body["temperature"] = 0.0
    return body


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, req: ClientRequest, t0: float, timeout_s: float
) -> list[SampleResult]:
    results = [SampleResult(req.request_id, k) for k in range(req.n)]
    delay = t0 + req.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter() - t0
    for r in results:
        r.sent_s = sent
    try:
        async with session.post(
            f"{url}/v1/completions",
            json=request_body(model, req),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300].replace("\n", " ")
                for r in results:
                    r.status, r.error, r.end_s = REJECTED, f"HTTP {resp.status}: {text}", time.perf_counter() - t0
                return results
            async for raw in resp.content:
                now = time.perf_counter() - t0
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                for choice in _choices(url, data):
                    idx = choice.get("index", 0)
                    if not 0 <= idx < req.n:
                        continue
                    ids = choice.get("token_ids")
                    count = len(ids) if isinstance(ids, list) else (1 if choice.get("text") else 0)
                    if count:
                        results[idx].chunk_times.append(now)
                        results[idx].chunk_tokens.append(count)
                    if choice.get("finish_reason") is not None:
                        results[idx].end_s = now
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        why = (str(exc) if isinstance(exc, BrokenStream) else f"{type(exc).__name__}: {exc}")[:300]
        for r in results:
            if r.error is None:
                r.error = why
    end = time.perf_counter() - t0
    for r in results:
        if r.end_s != r.end_s:  # NaN: no finish_reason came
            r.end_s = end
        if r.status != REJECTED:
            if r.tokens == req.output_len and r.error is None:
                r.status = FINISHED
            else:
                r.status = DROPPED
                r.error = r.error or f"{r.tokens} of {req.output_len} tokens came"
    return results


async def replay(
    url: str,
    model: str,
    requests: Sequence[ClientRequest],
    timeout_s: float,
    t0: float,
    beside: Callable[[], Awaitable[None]] | None = None,
) -> list[SampleResult]:
    """Send every request at ``t0`` (``time.perf_counter``) + its arrival; every sample's result,
    in request order. ``beside`` runs alongside (the ``/metrics`` scraper) until the last request
    is done."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        side = asyncio.ensure_future(beside()) if beside is not None else None
        try:
            done = await asyncio.gather(*(_one(session, url, model, r, t0, timeout_s) for r in requests))
        finally:
            if side is not None:
                side.cancel()
                try:
                    await side
                except (asyncio.CancelledError, Exception):
                    pass
    return [r for group in done for r in group]


async def get_text(url: str, timeout_s: float) -> tuple[int, str]:
    """One GET: (HTTP status, body); raises aiohttp.ClientError / asyncio.TimeoutError."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.text()


def model_name(url: str, timeout_s: float = 10.0) -> str:
    """The first model an OpenAI-compatible server lists (``/v1/models``); raises on no answer."""
    status, text = asyncio.run(get_text(f"{url}/v1/models", timeout_s))
    if status != 200:
        raise ValueError(f"/v1/models answered HTTP {status}")
    data = json.loads(text).get("data") or []
    if not data:
        raise ValueError("/v1/models lists no model")
    return str(data[0]["id"])
