"""Eager PyTorch behind docs/serving/app.py's very routes, for `make bench-serve`: the same
FastAPI app, batcher and request checks, with the model's nn.Module in place of the wheel.

Run as `uvicorn serve_eager:app --app-dir benchmarks` with docs/serving on PYTHONPATH and
MODEL_SPEC naming the spec (the module is built as the build builds it: same factory, same seed,
so its weights are the wheel's).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from app import MODEL_SLOTS, create_app, wheel

from pipeline.spec import load_spec
from pipeline.stages.loader import load_model


def load_eager() -> Any:
    module = load_model(load_spec(os.environ["MODEL_SPEC"])).module.eval()

    def run(*arrays: np.ndarray) -> Any:
        with torch.inference_mode():
            outputs = module(*(torch.from_numpy(a) for a in arrays))
        if isinstance(outputs, tuple):
            return tuple(o.numpy() for o in outputs)
        return outputs.numpy()

    return run


app = create_app(wheel.LazyModel(load_eager), slots=MODEL_SLOTS)
