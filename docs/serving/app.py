"""A FastAPI app serving a modelwheel wheel: `uvicorn app:app --workers 2` (docs/serving.md).

Requests and responses are .npz files (numpy.savez): one array per input, named as the model's
inputs, each with its batch first. POST /predict runs each request as its own call;
POST /predict/batched joins concurrent requests into calls of up to the built batch max.
MODEL_PACKAGE names the wheel's import package (default model_unet); MODEL_SLOTS how many calls
run at once (default 1), each on a thread of its own: give each OMP_NUM_THREADS = cores / slots.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response

MODEL_PACKAGE = os.environ.get("MODEL_PACKAGE", "model_unet")
wheel = importlib.import_module(MODEL_PACKAGE)


def call_slots(value: str) -> int:
    cores = len(os.sched_getaffinity(0))
    if not value.isdecimal() or not 1 <= int(value) <= cores:  # isdecimal: exactly the digits int() reads
        print(
            f"error: MODEL_SLOTS={value!r}: expected a whole number of concurrent calls, from 1 to the {cores} "
            "cores this process may use (unset, it is 1; docs/serving.md: One process, several threads)",
            file=sys.stderr,
        )
        # 3: "a worker failed to boot" to uvicorn's and gunicorn's supervisors, which then stop instead of
        # starting it again
        raise SystemExit(3)
    return int(value)


MODEL_SLOTS = call_slots(os.environ.get("MODEL_SLOTS", "1"))


def create_app(model: Any, max_wait_s: float = 0.005, slots: int = 1) -> FastAPI:
    """The routes, around any callable taking and returning numpy arrays (a LazyModel here;
    benchmarks/serve_bench.py passes eager PyTorch the same way), ``slots`` calls at a time."""
    app = FastAPI()
    # Every call on one of the model's own threads (not asyncio.to_thread's many: docs/serving.md
    # says why); the batcher's batches, one at a time, on the same threads
    calls = wheel.ModelThreads(model, count=slots)
    batcher = wheel.DynamicBatcher(model, max_wait_s=max_wait_s, threads=calls)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "model": MODEL_PACKAGE,
            "pid": os.getpid(),
            "loaded": getattr(model, "loaded", True),
            "slots": calls.count,
        }

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        inputs = await _read_inputs(request)
        try:
            wheel.check_request(inputs)  # the runtime's own message for a bad request, as a 422
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        # on the model's thread: the event loop keeps serving while the model runs
        return _npz_response(await calls(*inputs))

    @app.post("/predict/batched")
    async def predict_batched(request: Request) -> Response:
        inputs = await _read_inputs(request)
        try:
            outputs = await batcher(*inputs)  # checks the request alone, then joins a batch
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return _npz_response(outputs)

    return app


# The largest request body the model takes: a server reads no further (wheel.read_npz refuses it).
MAX_BODY_BYTES = wheel.max_request_bytes()


async def _read_inputs(request: Request) -> list[np.ndarray]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            break
    try:
        return wheel.read_npz(bytes(body))  # 400 not an .npz, 413 too large, 422 not named as the inputs
    except wheel.RequestError as exc:
        raise HTTPException(exc.status, str(exc)) from None


OUTPUT_NAMES = [spec["name"] for spec in wheel.manifest()["outputs"]]


def _npz_response(outputs: Any) -> Response:
    values = outputs if isinstance(outputs, tuple) else (outputs,)
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value) for name, value in zip(OUTPUT_NAMES, values)})
    return Response(
        buffer.getvalue(), media_type="application/octet-stream", headers={"x-worker-pid": str(os.getpid())}
    )


# Made before uvicorn (or gunicorn) starts its workers; each worker opens its own model on its
# first request. OMP_NUM_THREADS sets each model's threads (docs/serving.md).
app = create_app(wheel.lazy_load(num_models=MODEL_SLOTS, numpy=True), slots=MODEL_SLOTS)
