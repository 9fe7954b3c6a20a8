"""Ray Serve: the wheel in 2 replicas, concurrent requests batched by Ray's own @serve.batch
(docs/serving.md). `python ray_app.py --port 8000` serves POST / (.npz in, .npz out) on a
local Ray instance until interrupted; MODEL_PACKAGE names the wheel's import package.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import signal
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

MODEL_PACKAGE = os.environ.get("MODEL_PACKAGE", "model_unet")
wheel = importlib.import_module(MODEL_PACKAGE)
OUTPUT_NAMES = [spec["name"] for spec in wheel.manifest()["outputs"]]


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1})
class WheelModel:
    def __init__(self) -> None:
        self.model = wheel.load_numpy()  # each replica is its own process, with its own model

    async def __call__(self, request: Request) -> Response:
        try:
            inputs = wheel.read_npz(await request.body())  # 400 not an .npz, 413 too large, 422 misnamed
            wheel.check_request(inputs)  # alone, before it joins a batch: a bad one fails by itself
        except wheel.RequestError as exc:
            return JSONResponse({"detail": str(exc)}, exc.status)
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        outputs = await self.predict(inputs)
        values = outputs if isinstance(outputs, tuple) else (outputs,)
        buffer = io.BytesIO()
        np.savez(buffer, **dict(zip(OUTPUT_NAMES, values)))
        return Response(
            buffer.getvalue(), media_type="application/octet-stream", headers={"x-worker-pid": str(os.getpid())}
        )

    # Ray collects up to max_batch_size concurrent requests within the wait budget; run_batch
    # runs them as calls of at most the built batch max and splits the outputs back.
    @serve.batch(max_batch_size=wheel.max_batch(), batch_wait_timeout_s=0.005)
    async def predict(self, requests: list[list[np.ndarray]]) -> list[Any]:
        return wheel.run_batch(self.model, requests)


app = WheelModel.bind()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(app, route_prefix="/", blocking=False)
    print(f"serving {MODEL_PACKAGE} on http://127.0.0.1:{args.port}/", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    try:
        signal.pause()
    except KeyboardInterrupt:  # then the replicas and the local Ray instance end too
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
