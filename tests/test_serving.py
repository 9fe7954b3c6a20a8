"""Real servers around the installed tiny wheel (docs/serving.md): the page's own example files,
run as written. uvicorn with 2 workers, and (slow) Ray Serve with 2 replicas and @serve.batch."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import importlib.util
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from pipeline.spec import load_spec
from pipeline.stages.loader import load_model

from .conftest import REPO, TINY_SPEC, make_venv, pip_install

SERVING = REPO / "docs" / "serving"
_spec = importlib.util.spec_from_file_location("serving_client", SERVING / "client.py")
client = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = client  # its dataclass looks its module up
_spec.loader.exec_module(client)

REQUESTS = 240  # per endpoint: a bounded load, answered within LOAD_TIMEOUT_S
CONCURRENCY = 16
LOAD_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def served_python(installed) -> Path:
    """The session's virtualenv with the wheel, plus what docs/serving/requirements.txt names
    (nothing the other tests of that virtualenv use), installed as a user's pip would: from PyPI,
    this machine's pip settings (its local mirror) off."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(
        [str(installed), "-m", "pip", "install", "--quiet", "-r", str(SERVING / "requirements.txt")],
        capture_output=True,
        text=True,
        env=plain,
        timeout=600,
    )
    assert done.returncode == 0, f"pip install -r docs/serving/requirements.txt failed:\n{done.stdout}{done.stderr}"
    return installed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(
    cmd: list[str],
    ready: Callable[[], bool],
    log: Path,
    startup_s: float = 90.0,
    env_extra: dict[str, str] | None = None,
) -> Iterator[None]:
    """Run ``cmd`` in its own session until ``ready()``; stop its whole process group afterwards,
    whatever happened."""
    env = {**os.environ, "MODEL_PACKAGE": "model_tiny", "OMP_NUM_THREADS": "1", **(env_extra or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, cwd=SERVING, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + startup_s
        while not ready():
            assert process.poll() is None, f"the server exited ({process.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the server did not answer in {startup_s}s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield
    finally:
        _stop(process)


def answers_ok(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def ray_route_ready(base: str) -> Callable[[], bool]:
    """Ray Serve's proxy lists the app's route once its replicas are up."""

    def ready() -> bool:
        try:
            return "/" in httpx.get(base + "-/routes", timeout=2).json()
        except (httpx.TransportError, ValueError):
            return False

    return ready


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # anything of the group still there
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def requests_of(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Seeded requests of batch 1 to 4 (the tiny model's built range)."""
    rng = np.random.default_rng(seed)
    made = []
    for i in range(count):
        batch = 1 + i % 4
        made.append(
            {
                "x": rng.standard_normal((batch, 3, 8, 8), dtype=np.float32),
                "t": (rng.random(batch) * 1000).astype(np.float32),
            }
        )
    return made


def assert_matches_eager(requests: list[dict[str, np.ndarray]], answers: list, wheel: Path) -> None:
    eager = load_model(load_spec(TINY_SPEC)).module
    with zipfile.ZipFile(wheel) as archive:
        outputs = json.loads(archive.read("model_tiny/manifest.json"))["outputs"]
    tolerances = {o["name"]: (o["rtol"], o["atol"]) for o in outputs}  # the build's own
    for request, answer in zip(requests, answers):
        assert answer.status == 200, answer.detail
        with torch.no_grad():
            expected = eager(torch.from_numpy(request["x"]), torch.from_numpy(request["t"]))
        for name, want in zip(("features", "logits"), expected):
            rtol, atol = tolerances[name]
            torch.testing.assert_close(torch.from_numpy(answer.outputs[name]), want, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def uvicorn_url(served_python, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    cmd = [str(served_python), "-m", "uvicorn", "app:app", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)]
    with server(cmd, answers_ok(f"http://127.0.0.1:{port}/health"), tmp_path_factory.mktemp("uvicorn") / "server.log"):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("route", ["/predict", "/predict/batched"])
def test_uvicorn_two_workers_answer_a_load_as_eager_does(uvicorn_url, route, wheel):
    # a connection per request, so both workers take some; which worker accepts a connection is the
    # kernel's choice, and a fresh-clone run on a busy machine once saw one take all 240 of a load:
    # up to three loads, each answered as eager does, until both have served
    served: set[str] = set()
    for attempt in range(3):
        requests = requests_of(REQUESTS, seed=len(route) + attempt)
        answers = asyncio.run(
            client.load_test(uvicorn_url + route, requests, CONCURRENCY, LOAD_TIMEOUT_S, keep_alive=False)
        )
        assert_matches_eager(requests, answers, wheel)
        served |= {a.worker for a in answers}
        if len(served) == 2:
            break
    assert len(served) == 2, "both worker processes served"


def test_requests_at_a_set_rate_are_sent_on_time_and_answered_as_eager_does(uvicorn_url, wheel):
    """docs/serving/client.py's open load, the one `make bench-serve` measures p99 at a rate with:
    requests go out at their scheduled times however slow the answers, and each latency counts
    from that time."""
    requests = requests_of(60, seed=11)
    started = time.monotonic()
    answers = asyncio.run(
        client.paced_load(uvicorn_url + "/predict/batched", requests, rate_per_s=40.0, seed=3, timeout_s=LOAD_TIMEOUT_S)
    )
    took = time.monotonic() - started
    assert_matches_eager(requests, answers, wheel)
    last_send = client.arrival_times(60, 40.0, seed=3)[-1]
    assert 0.5 < last_send < 4.0  # 60 requests at 40/s: about 1.5 s of sending
    assert took >= last_send, "the last request went out before its time"
    assert all(0 < a.latency_s < took for a in answers)


BAD = [
    (
        {"x": np.zeros((1, 3, 8, 8), np.float64), "t": np.zeros(1, np.float32)},
        "input 'x': expected dtype float32, got float64",
    ),
    ({"x": np.zeros((1, 3, 9, 8), np.float32), "t": np.zeros(1, np.float32)}, "input 'x': dim 2 must be 8, got 9"),
    (
        {"x": np.zeros((5, 3, 8, 8), np.float32), "t": np.zeros(5, np.float32)},
        "input 'x': dim 0 (batch) is 5, outside the built range [1, 4]",
    ),
    (
        {"x": np.zeros((2, 3, 8, 8), np.float32), "t": np.zeros(3, np.float32)},
        "input 't': dim 0 (batch) is 3, but input 'x' has batch=2",
    ),
    ({"x": np.zeros((1, 3, 8, 8), np.float32)}, "expected arrays named ['x', 't'], got ['x']"),
]


@pytest.mark.parametrize("route", ["/predict", "/predict/batched"])
def test_bad_requests_get_the_runtimes_message_and_the_server_keeps_serving(uvicorn_url, route, wheel):
    good = requests_of(20, seed=7)
    mixed = [item for pair in zip(good, [bad for bad, _ in BAD] * 4) for item in pair]  # bad ones among good ones
    answers = asyncio.run(client.load_test(uvicorn_url + route, mixed, CONCURRENCY, LOAD_TIMEOUT_S))
    bad_answers = answers[1::2]
    for answer, (_, message) in zip(bad_answers, BAD * 4):
        assert answer.status == 422 and answer.detail == message
    assert_matches_eager(good, answers[0::2], wheel)
    junk = httpx.post(uvicorn_url + route, content=b"not an npz file", timeout=30)
    assert junk.status_code == 400 and junk.json()["detail"].startswith("the body must be an .npz file")
    after = requests_of(4, seed=8)
    assert_matches_eager(after, asyncio.run(client.load_test(uvicorn_url + route, after, 4, LOAD_TIMEOUT_S)), wheel)


def npz_body(save, **arrays) -> bytes:
    buffer = io.BytesIO()
    save(buffer, **arrays)
    return buffer.getvalue()


def test_bodies_that_are_no_request_are_refused_before_they_are_unpacked(uvicorn_url, wheel):
    """Not an .npz (JSON, a bare .npy), a body over the largest request the model takes, or a small
    compressed .npz that would unpack to 400 times its size: 400 or 413 saying what was wrong, and
    nothing is unpacked for the last two (before, the server's memory grew by the unpacked size)."""
    npy = io.BytesIO()
    np.save(npy, np.zeros((1, 3, 8, 8), np.float32))
    largest = (
        4 * 3 * 8 * 8 * 4 + 4 * 4
    )  # batch max 4: x float32 (4, 3, 8, 8) and t float32 (4,); + 4096 for the .npz's own
    bomb = npz_body(np.savez_compressed, x=np.zeros((4000, 3, 8, 8), np.float32), t=np.zeros(4000, np.float32))
    assert len(bomb) < largest + 4096  # within the body limit: only unpacking would pass it
    cases = [
        (
            b'{"x": [[1.0]], "t": [1.0]}',
            400,
            "the body must be an .npz file (numpy.savez), one array per input named as the model's inputs ['x', 't']",
        ),
        (npy.getvalue(), 400, "the body must be an .npz file (numpy.savez)"),
        (b"PK" + bytes(largest + 8192), 413, f"the body is over the {largest + 4096} bytes of the largest request"),
        (
            bomb,
            413,
            f"the arrays unpack to 3088256 bytes, over the {largest + 4096} of the largest request the model takes",
        ),
    ]
    for route in ("/predict", "/predict/batched"):
        for body, status, says in cases:
            answer = httpx.post(uvicorn_url + route, content=body, timeout=30)
            assert answer.status_code == status and answer.json()["detail"].startswith(says), answer.text
    good = requests_of(4, seed=9)
    assert_matches_eager(good, asyncio.run(client.load_test(uvicorn_url + "/predict", good, 4, LOAD_TIMEOUT_S)), wheel)


def test_the_client_reports_an_error_answer_that_is_not_json():
    """A crash's 500 from uvicorn is plain text, a proxy's 502 HTML: the load goes on, and the answer
    says what came back (it used to end the whole load in a JSONDecodeError)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(502)
            self.end_headers()
            self.wfile.write(b"<html>bad gateway</html>")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/"
        answers = asyncio.run(client.load_test(url, requests_of(3, seed=1), 2, LOAD_TIMEOUT_S))
    finally:
        httpd.shutdown()
    assert [(a.status, a.detail) for a in answers] == [(502, "<html>bad gateway</html>")] * 3


FORK_CHECK = """
import os, numpy as np, model_tiny
lazy = model_tiny.lazy_load(numpy=True)
lazy.get()  # loaded before the fork, never called there
x = np.ones((2, 3, 8, 8), np.float32); t = np.ones(2, np.float32)
pid = os.fork()
if pid == 0:
    features, logits = lazy(x, t)  # the child opens its own model
    np.save("child.npy", logits)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
np.testing.assert_array_equal(np.load("child.npy"), lazy(x, t)[1])
print("ok")
"""


def test_a_lazy_model_loaded_before_fork_runs_in_the_child(served_python, tmp_path):
    done = subprocess.run(
        [str(served_python), "-c", FORK_CHECK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


BATCHER_CHECK = """
import asyncio, json, numpy as np, model_tiny
model = model_tiny.load_numpy()
calls = []
def counted(*inputs):
    calls.append(len(inputs[0]))
    return model(*inputs)
batcher = model_tiny.DynamicBatcher(counted, max_wait_s=0.05)
rng = np.random.default_rng(0)
requests = [
    (rng.standard_normal((b, 3, 8, 8), dtype=np.float32), np.full(b, 5.0, np.float32))
    for b in [1, 2, 1, 3, 1, 1, 4, 2]
]
async def main():
    return await asyncio.gather(*(batcher(*r) for r in requests))
answers = asyncio.run(main())
for request, (features, logits) in zip(requests, answers):
    alone = model(*request)
    np.testing.assert_allclose(features, alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, alone[1], rtol=1e-5, atol=1e-6)
batched = list(calls)
calls.clear()
listed = [(rng.standard_normal((b, 3, 8, 8), dtype=np.float32), np.full(b, 5.0, np.float32)) for b in [3, 3, 1, 1]]
for request, (features, logits) in zip(listed, model_tiny.run_batch(counted, listed)):
    np.testing.assert_allclose(logits, model(*request)[1], rtol=1e-5, atol=1e-6)
print(json.dumps({"batched": batched, "listed": calls}))
"""


def test_the_batcher_joins_concurrent_requests_up_to_the_batch_max(served_python, tmp_path):
    done = subprocess.run(
        [str(served_python), "-c", BATCHER_CHECK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)
    # 15 samples within one wait budget: calls of at most 4 (the built max), requests never split,
    # each joining the first call with room (first fit): 4 calls, where filling calls in turn made 5
    assert sum(calls["batched"]) == 15 and max(calls["batched"]) == 4 and len(calls["batched"]) == 4, calls
    assert calls["listed"] == [4, 4], calls  # run_batch on sizes 3, 3, 1, 1: two calls, not 3 + 4 + 1


THREADS_CHECK = """
import asyncio, json, threading, numpy as np, model_tiny
model = model_tiny.load_numpy(num_models=2)
seen = []
def recorded(*inputs):
    seen.append(threading.get_ident())
    return model(*inputs)
calls = model_tiny.ModelThreads(recorded)
batcher = model_tiny.DynamicBatcher(recorded, max_wait_s=0.01, threads=calls)
rng = np.random.default_rng(0)
requests = [
    (rng.standard_normal((b, 3, 8, 8), dtype=np.float32), np.full(b, 5.0, np.float32)) for b in [1, 2, 3, 1] * 5
]
async def both():
    return await asyncio.gather(*(calls(*r) for r in requests)), await asyncio.gather(*(batcher(*r) for r in requests))
for answers in asyncio.run(both()):
    for request, (features, logits) in zip(requests, answers):
        np.testing.assert_allclose(logits, model(*request)[1], rtol=1e-5, atol=1e-6)
one = set(seen)
seen.clear()
two = model_tiny.ModelThreads(recorded, count=2)
async def more():
    return await asyncio.gather(*(two(*r) for r in requests * 3))
asyncio.run(more())
asyncio.run(more())  # a second event loop: the same threads
print(json.dumps({"one": len(one), "on_main": threading.get_ident() in one | set(seen), "two": len(set(seen))}))
"""


def test_an_asyncio_servers_calls_run_on_the_models_own_threads_only(served_python, tmp_path):
    """ModelThreads: every call (direct or batched) from one thread, never the event loop's, the
    same threads across event loops; count=2 uses two."""
    done = subprocess.run(
        [str(served_python), "-c", THREADS_CHECK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"one": 1, "on_main": False, "two": 2}


def test_the_app_with_two_call_slots_answers_a_load_as_eager_does(served_python, tmp_path, wheel):
    """MODEL_SLOTS=2: one worker, two calls at a time (two model threads, num_models=2)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(served_python), "-m", "uvicorn", "app:app", "--workers", "1", "--host", "127.0.0.1", "--port", str(port)]
    with server(cmd, answers_ok(url + "/health"), tmp_path / "server.log", env_extra={"MODEL_SLOTS": "2"}):
        requests = requests_of(120, seed=5)
        assert_matches_eager(
            requests, asyncio.run(client.load_test(url + "/predict", requests, CONCURRENCY, LOAD_TIMEOUT_S)), wheel
        )
        assert httpx.get(url + "/health", timeout=10).json()["slots"] == 2


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("slots", ["two", "0", "²", "999"])  # "²" is a digit to str.isdigit, not to int()
def test_a_bad_slot_count_stops_the_app_saying_what_to_set(served_python, slots, workers, tmp_path):
    """With --workers 2 uvicorn's supervisor started each failed worker again, forever: exit code 3
    (a worker that failed to boot, to uvicorn and gunicorn alike) stops it."""
    cmd = [str(served_python), "-m", "uvicorn", "app:app", "--port", str(free_port()), "--workers", workers]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd,
            cwd=SERVING,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MODEL_PACKAGE": "model_tiny", "MODEL_SLOTS": slots},
        )
    try:
        code = process.wait(timeout=60)
    finally:
        _stop(process)
    said = log.read_text()
    cores = len(os.sched_getaffinity(0))
    assert said.count("error: MODEL_SLOTS=") == int(workers), said  # each worker once, none started again
    # one worker: the app's exit code; under the supervisor, uvicorn's own (0 after it stops itself)
    assert code == 3 if workers == "1" else "failed to start, stopping the parent process" in said, said
    assert (
        f"error: MODEL_SLOTS={slots!r}: expected a whole number of concurrent calls, from 1 to the {cores} cores"
        in said
    )


THREADS_FORK_CHECK = """
import asyncio, os, threading, model_tiny
threads = model_tiny.ModelThreads(threading.get_native_id)  # no OpenMP: only the threads are tested
parent = asyncio.run(threads())  # the parent's thread exists now; a fork does not copy it
pid = os.fork()
if pid == 0:
    os._exit(0 if asyncio.run(asyncio.wait_for(threads(), 10)) != parent else 3)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_model_threads_used_before_a_fork_start_their_own_in_the_child(served_python, tmp_path):
    done = subprocess.run(
        [str(served_python), "-c", THREADS_FORK_CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stdout + done.stderr


def included_blocks(page: Path) -> list[tuple[str, str]]:
    """(file, code) for every code block the page marks as a copy of an example file."""
    pattern = re.compile(r"<!-- include: (\S+) -->\n```\w*\n(.*?)```", re.S)
    return pattern.findall(page.read_text())


def test_the_page_shows_the_examples_the_tests_run():
    blocks = included_blocks(REPO / "docs" / "serving.md")
    assert {name for name, _ in blocks} >= {
        "docs/serving/app.py",
        "docs/serving/ray_app.py",
        "docs/serving/client.py",
        "docs/serving/Dockerfile",
    }
    for name, code in blocks:
        assert code == (REPO / name).read_text(), f"docs/serving.md's copy of {name} differs from the file"


@pytest.mark.slow
def test_ray_serve_two_replicas_with_serve_batch_answer_as_eager_does(tmp_path, wheel):
    # a virtualenv of its own: Ray brings many packages the session's shared one should not get
    served_python = make_venv(tmp_path / "env")
    pip_install(
        served_python, str(wheel), "-r", str(SERVING / "requirements.txt"), "-r", str(SERVING / "requirements-ray.txt")
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with server(
        [str(served_python), "ray_app.py", "--port", str(port)],
        ray_route_ready(url),
        tmp_path / "ray.log",
        startup_s=180,
    ):
        requests = requests_of(REQUESTS, seed=3)
        answers = asyncio.run(client.load_test(url, requests, CONCURRENCY, LOAD_TIMEOUT_S))
        assert_matches_eager(requests, answers, wheel)
        assert len({a.worker for a in answers}) == 2, "both replicas served"
        bad = asyncio.run(client.load_test(url, [b for b, _ in BAD], 4, LOAD_TIMEOUT_S))
        assert [(a.status, a.detail) for a in bad] == [(422, m) for _, m in BAD]
        junk = httpx.post(url, content=b"not an npz file", timeout=30)
        assert junk.status_code == 400 and junk.json()["detail"].startswith("the body must be an .npz file")
        after = requests_of(8, seed=4)
        assert_matches_eager(after, asyncio.run(client.load_test(url, after, 4, LOAD_TIMEOUT_S)), wheel)
