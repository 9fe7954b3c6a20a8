"""An HTTP client for docs/serving/app.py and ray_app.py: .npz in, .npz out, and two loads that
record each request's latency (docs/serving.md): a bounded number of concurrent requests, and
requests at a given rate whatever the server does."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode(body: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(body), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@dataclass
class Answer:
    status: int
    outputs: dict[str, np.ndarray] | None  # None unless status is 200
    detail: str  # the error message of a 4xx answer
    latency_s: float
    worker: str | None  # the serving process, when the server says


async def post(client: httpx.AsyncClient, url: str, inputs: dict[str, np.ndarray]) -> Answer:
    started = time.perf_counter()
    response = await client.post(url, content=encode(inputs), headers={"content-type": "application/octet-stream"})
    latency = time.perf_counter() - started
    if response.status_code == 200:
        return Answer(200, decode(response.content), "", latency, response.headers.get("x-worker-pid"))
    try:  # the app's errors are JSON ({"detail": ...}); a crash's or a proxy's may be any text
        detail = str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        detail = response.text
    return Answer(response.status_code, None, detail, latency, None)


async def load_test(
    url: str,
    requests: Sequence[dict[str, np.ndarray]],
    concurrency: int,
    timeout_s: float = 60.0,
    keep_alive: bool = True,
) -> list[Answer]:
    """Send every request, at most ``concurrency`` at a time; answers in the requests' order.
    ``timeout_s`` bounds the whole load, not each request: give it room for all of them.
    ``keep_alive=False`` opens a connection per request, so a multi-worker server spreads them."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency if keep_alive else 0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:

        async def one(inputs: dict[str, np.ndarray]) -> Answer:
            async with gate:
                return await post(client, url, inputs)

        return await asyncio.wait_for(asyncio.gather(*(one(r) for r in requests)), timeout_s)


async def paced_load(
    url: str, requests: Sequence[dict[str, np.ndarray]], rate_per_s: float, seed: int = 0, timeout_s: float = 60.0
) -> list[Answer]:
    """Send the requests at ``rate_per_s`` on average, at random times (a Poisson process drawn
    from ``seed``), each when its time comes whatever the answers do, as independent users
    would; answers in the requests' order. A server slower than the rate makes requests queue,
    so each latency counts from the request's scheduled time, queueing included. ``timeout_s``
    bounds the whole load, as in ``load_test``."""
    arrivals = arrival_times(len(requests), rate_per_s, seed)
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=timeout_s) as client:

        async def one(at: float, inputs: dict[str, np.ndarray]) -> Answer:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            answer = await post(client, url, inputs)
            answer.latency_s = loop.time() - (start + at)
            return answer

        return await asyncio.wait_for(asyncio.gather(*(one(at, r) for at, r in zip(arrivals, requests))), timeout_s)


def arrival_times(count: int, rate_per_s: float, seed: int = 0) -> np.ndarray:
    """``paced_load``'s send times, in seconds from its start: the same for the same arguments."""
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate_per_s, count))
