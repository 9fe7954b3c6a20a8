"""What publish refuses before anything is uploaded (a renamed wheel, a damaged manifest), and
where it sends credentials (the index's own scheme, host and port only)."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import threading

import pytest

from .conftest import run_cli
from .test_publish import rewrite

NOWHERE = "http://127.0.0.1:9/"  # nothing listens there: a refusal must come before any connection


@pytest.mark.parametrize(("name", "said"), [("model_other", "model-other 0.1"), ("model_tiny-0.9", "model-tiny 0.9")])
def test_a_renamed_wheel_is_refused_naming_both_names(wheel, tmp_path, name, said):
    """The tiny wheel copied as model_other-0.1-... or model_tiny-0.9-... (RECORD untouched) was
    uploaded with exit 0, and the index held that name and version for good."""
    label = wheel.name.split("-", 2)[1].partition("+")[2]
    renamed = tmp_path / wheel.name.replace("model_tiny-0.1", name if "-" in name else f"{name}-0.1")
    shutil.copy(wheel, renamed)
    ran = run_cli("publish", "--wheel", str(renamed), "--index", NOWHERE, cwd=tmp_path)
    assert ran.code == 15, ran.err
    assert (
        f"error: {renamed}: a renamed wheel: its file name says {said}+{label}, its METADATA "
        f"(model_tiny-0.1+{label}.dist-info/METADATA) says model-tiny 0.1+{label}, its manifest says "
        f"model-tiny 0.1+{label}"
    ) in ran.err
    assert f"hint: publish the file under the name its build gave it (model_tiny-0.1+{label}-...whl)" in ran.err


@pytest.mark.parametrize(
    ("makelevel", "build"),
    [
        ("", "`modelwheel build --spec <its spec.toml>` (`make build MODEL=<name>` in a checkout)"),
        ("1", "`make build MODEL=<name>`"),
    ],
)
def test_a_wheel_that_is_not_there_is_said_before_any_index(tmp_path, makelevel, build):
    """H60: from a folder with no local index, `publish --wheel <typo>` said "no package index"
    (exit 13), and only the next try, with an index, that the wheel was not there; the pip-installed
    tool's hint said `make build`, which only a checkout has."""
    missing = tmp_path / "dist" / "model_nope-1.0-py3-none-any.whl"
    ran = run_cli("publish", "--wheel", str(missing), cwd=tmp_path, env={"MAKELEVEL": makelevel})
    assert ran.code == 2, ran.err
    assert ran.err.splitlines()[-2:] == [
        f"error: no such wheel: {missing}",
        f"hint: build it first with {build}, or give the path of one it built",
    ], ran.err
    assert not (tmp_path / "build").exists(), "nothing written"
    # a name mistyped beside wheels that are there: those named, as reproduce names them (H63)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "model_nope-1.0+cpu.torch2.13.0-py3-none-any.whl").write_bytes(b"")
    ran = run_cli("publish", "--wheel", str(missing), cwd=tmp_path, env={"MAKELEVEL": makelevel})
    assert ran.err.splitlines()[-1] == (
        f"hint: build it first with {build}, or give the path of one it built; the wheels in {tmp_path / 'dist'}: "
        "model_nope-1.0+cpu.torch2.13.0-py3-none-any.whl"
    ), ran.err
    # a relative path: where it was looked for (H68 ran it from /)
    ran = run_cli("publish", "--wheel", "dist/nope.whl", cwd=tmp_path, env={"MAKELEVEL": makelevel})
    assert f"error: no such wheel: dist/nope.whl (looked for {tmp_path / 'dist' / 'nope.whl'})" in ran.err, ran.err
    # `make publish MODEL=unet ARGS="--wheel …"` (make gives --spec models/unet/spec.toml): that model named (H66)
    ran = run_cli(
        "publish",
        "--spec",
        "models/unet/spec.toml",
        "--wheel",
        str(missing),
        cwd=tmp_path,
        env={"MAKELEVEL": makelevel},
    )
    named = build.replace("<name>", "unet").replace("<its spec.toml>", "models/unet/spec.toml")
    assert f"hint: build it first with {named}, or give the path" in ran.err, ran.err


def test_a_wheel_given_as_the_model_is_said_with_the_flag_that_takes_it(tmp_path):
    """H62: `modelwheel publish dist/x.whl` read the path as a model name: "models/dist/x.whl/spec.toml:
    no such spec file"."""
    ran = run_cli("publish", "--index", "http://127.0.0.1:8765/", "dist/model_tiny-0.1-py3-none-any.whl", cwd=tmp_path)
    assert ran.code == 2, ran.err
    # the command as given, the wheel moved to --wheel (H63: the hint dropped --index, and failed from /)
    assert ran.err.splitlines()[-2:] == [
        "error: dist/model_tiny-0.1-py3-none-any.whl: a wheel, given where publish takes a model name",
        "hint: give wheels with --wheel: modelwheel publish --index http://127.0.0.1:8765/ --wheel "
        "dist/model_tiny-0.1-py3-none-any.whl",
    ], ran.err
    # nothing to publish named: each way to name it, --wheel too, with the flags given (H66 was told of two)
    ran = run_cli("publish", "--index", "http://127.0.0.1:8765/", cwd=tmp_path)
    assert ran.code == 2, ran.err
    assert ran.err.splitlines()[-2:] == [
        "error: give a model name, --spec PATH or --wheel PATH (one of them)",
        "hint: e.g. modelwheel publish --spec my_model/spec.toml, or make publish MODEL=unet in a checkout, or "
        "modelwheel publish --index http://127.0.0.1:8765/ --wheel dist/<wheel>.whl for a wheel built already",
    ], ran.err
    # a model name with no spec here (`publish unet` from /): said before the missing index (H62)
    ran = run_cli("publish", "unet", cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": ""})
    assert ran.code == 3, ran.err
    assert (
        f"error: models/unet/spec.toml: no such spec file (looked for {tmp_path / 'models' / 'unet' / 'spec.toml'})"
        in ran.err
    )


@pytest.mark.parametrize(
    ("manifest", "says"),
    [
        (
            b"{not json",
            "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b"[]", "is a JSON list, not a manifest"),
        (
            b'{"verification": {"passed": true}}',
            "is not a manifest of this pipeline: import_name, dist_name, full_version, "
            "artifacts, golden missing or of the wrong type",
        ),
    ],
)
def test_a_damaged_manifest_with_a_consistent_record_is_refused_naming_it(wheel, tmp_path, manifest, says):
    """A wheel whose manifest.json is damaged but listed in its RECORD with its own hash gave a
    traceback (JSONDecodeError, AttributeError) and exit 1."""
    (tmp_path / "out").mkdir()
    damaged = rewrite(
        wheel,
        tmp_path / "out",
        lambda name, data: manifest if name == "model_tiny/manifest.json" else data,
        rerecord=True,
    )
    ran = run_cli("publish", "--wheel", str(damaged), "--index", NOWHERE, cwd=tmp_path)
    assert ran.code == 15, ran.err
    assert f"error: {damaged}: model_tiny/manifest.json {says}" in ran.err
    assert "Traceback" not in ran.err


@contextlib.contextmanager
def serving(host: str, answer):
    """A server on ``host`` answering GETs with ``answer(path) -> bytes``, recording each request's
    path and Authorization header."""
    seen: list[tuple[str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = answer(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{host}:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("elsewhere", ["127.0.0.2", "127.0.0.1"])  # another host; the same host on another port
def test_skip_existing_sends_credentials_to_the_index_s_own_origin_only(wheel, tmp_path, elsewhere):
    """The index's simple page linked its file on another host, without #sha256: publish
    --skip-existing downloaded it to compare, sending the user's password there."""
    data = wheel.read_bytes()
    with serving(elsewhere, lambda path: data) as (files, fetched):
        page = f'<a href="{files}/files/{wheel.name}">{wheel.name}</a>'.encode()
        with serving("127.0.0.1", lambda path: page) as (index, pages):
            ran = run_cli(
                "publish",
                "--skip-existing",
                "--wheel",
                str(wheel),
                "--index",
                index.replace("http://", "http://alice:S3cretPw@") + "/",
                cwd=tmp_path,
                env={"MODELWHEEL_SIMPLE_URL": ""},
            )
    assert ran.code == 0, ran.err
    assert f"{wheel.name}: already on the index (cpu), the same file, left as it is" in ran.err
    assert fetched == [(f"/files/{wheel.name}", None)]  # the file, fetched without credentials
    assert [auth.startswith("Basic ") for _, auth in pages] == [True]  # the index's own page, with them


# The swap another user made while `twine check` ran, at a moment a test can hold: as the check's
# process exits, the wheel at SWAP_TARGET is replaced by SWAP_WITH (python runs sitecustomize at start).
SWAP_AFTER_CHECK = """
import atexit, os, sys
def _swap():
    if "check" in sys.argv[1:] and os.path.exists(os.environ["SWAP_WITH"]):
        os.replace(os.environ["SWAP_WITH"], os.environ["SWAP_TARGET"])
atexit.register(_swap)
"""


def test_the_wheel_checked_is_the_wheel_uploaded(wheel, tmp_path):
    """With --wheel in a folder another user can write, the file was replaced while twine check
    ran: the index received the swapped wheel, which publish would have refused on its own."""
    home = tmp_path / "home"
    home.mkdir()
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert started.code == 0, started.err
    try:
        shared = tmp_path / "shared"
        shared.mkdir()
        given = shared / wheel.name
        shutil.copy(wheel, given)
        shutil.copy(wheel.parent / ("-".join(wheel.name.split("-")[:2]) + ".report.json"), shared)  # its report
        (tmp_path / "swapped").mkdir()
        swapped = rewrite(
            wheel, tmp_path / "swapped", lambda name, data: data + b"\0" if name.endswith(".so") else data
        )
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(SWAP_AFTER_CHECK)
        ran = run_cli(
            "publish",
            "--wheel",
            str(given),
            cwd=home,
            env={
                "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
                "SWAP_WITH": str(swapped),
                "SWAP_TARGET": str(given),
            },
        )
        assert not swapped.exists(), "the swap happened"
        assert ran.code == 0, ran.err
        assert (home / "data" / "cpu" / wheel.name).read_bytes() == wheel.read_bytes()
    finally:
        run_cli("index", "stop", cwd=home)
