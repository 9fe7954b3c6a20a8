"""The live status area is drawn by a process of its own (pipeline/services/live.py): it keeps ticking
while the build holds the GIL, keeps the build's lines in order, and ends with the build
however the build ends, leaving the cursor shown."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pipeline.errors import BuildInterrupted
from pipeline.services.progress import STATUS_ENV

from .conftest import REPO, TINY_SPEC

TERMINAL_ENV = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")} | {"TERM": "xterm"}
SHOW_CURSOR = "\x1b[?25h"

# Runs under a pty with a live status; writes marks (a word a line) to the fd in argv[1].
HOLD_THE_GIL = """
    import ctypes, os, sys, threading, time
    from pipeline.services.live_progress import for_stream

    marks = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    progress = for_stream(sys.stderr)
    ticks, done = [], threading.Event()

    def tick():  # a Python thread: it runs only while the main thread lets go of the GIL
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    with progress.stage("compile", "1 candidate(s)"):
        progress.step("1/1 spec-options: verifying")
        threading.Thread(target=tick, daemon=True).start()
        time.sleep(0.5)
        marks.write("hold\\n")
        held_from = time.monotonic()
        # PyDLL: the GIL stays held through the C call, as AOTInductor's runner does
        ctypes.PyDLL(None).usleep(3_000_000)
        held_to = time.monotonic()
        marks.write("held\\n")
        done.set()
        print(f"ticks while held: {sum(held_from < t < held_to for t in ticks)}", file=sys.stderr)
        for number in range(50):
            progress.say(f"line {number}")
    progress.close()
"""

# Starts a live status, forks a child that keeps the renderer's pipe open, then waits to be killed.
KILLED_WHILE_LIVE = """
    import os, sys, time
    from pipeline.services.live_progress import for_stream

    marks = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    progress = for_stream(sys.stderr)
    progress.say("before the kill")
    with progress.stage("compile"):
        progress.step("1/1 spec-options: timing")
        forked = os.fork()
        if forked == 0:  # like a worker torch forks: it holds the renderer's pipe (not the terminal)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(marks.fileno())
            time.sleep(60)
            os._exit(0)
        marks.write(f"forked {forked} renderer {progress.renderer.pid}\\n")
        time.sleep(60)
"""


def on_terminal(command: list[str], *, until: str = "", then=None) -> tuple[int, str, list[tuple[float, str]], dict]:
    """Run ``command`` in a session of its own with a pseudo-terminal as its stdio and a pipe for
    marks (its fd where ``{marks}`` is); once ``until`` is seen on the terminal or as a mark, call
    ``then(process, marks)``. Returns the exit code, the terminal's text, each chunk with when it
    came, and each mark's words with when it came."""
    master, slave = pty.openpty()
    marks_read, marks_write = os.pipe()
    command = [str(marks_write) if part == "{marks}" else part for part in command]
    process = subprocess.Popen(
        command,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=TERMINAL_ENV,
        cwd=REPO,
        pass_fds=(marks_write,),
        start_new_session=True,
    )
    os.close(slave)
    os.close(marks_write)
    began, chunks, marks, text, open_fds = time.monotonic(), [], {}, "", [master, marks_read]
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], 1.0)
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the terminal's last holder closed it
                data = b""
            if not data:
                open_fds.remove(fd)
            elif fd == marks_read:
                for line in data.decode().splitlines():
                    marks[line.split()[0]] = (line.split()[1:], time.monotonic() - began)
            else:
                chunks.append((time.monotonic() - began, data.decode(errors="replace")))
                text += chunks[-1][1]
        if then is not None and until and (until in text or until in marks):
            then(process, marks)
            then = None
        if time.monotonic() - began > 300:
            process.kill()
            raise AssertionError(f"still running after 300 s:\n{text}")
    os.close(master)
    os.close(marks_read)
    return process.wait(), text, chunks, marks


def gone(pid: int) -> bool:
    try:
        return "pipeline.services.live" not in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return True


def renderers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children if not gone(int(child))]


def shows_the_cursor_at_the_end(text: str) -> bool:
    return SHOW_CURSOR in text[text.rfind("in all") :]


def test_status_ticks_while_a_c_call_holds_the_gil(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(HOLD_THE_GIL))
    code, text, chunks, marks = on_terminal([sys.executable, str(script), "{marks}"])
    assert code == 0, text
    assert re.search(r"ticks while held: [01]\r\n", text), text  # the call did keep the GIL
    hold, held = marks["hold"][1], marks["held"][1]
    during = [(at, chunk) for at, chunk in chunks if hold < at < held]
    moments = [hold] + [at for at, _ in during] + [held]
    assert max(b - a for a, b in zip(moments, moments[1:])) < 1.0, (marks, chunks)  # redrawn at least once a second
    drawn = {
        # two rows: what runs, then its times (one row was cut off narrow terminals)
        seconds
        for _, chunk in during
        for seconds in re.findall(r"spec-options: verifying\r?\n  (\d+)s in compile", chunk)
    }
    assert len(drawn) >= 3, (marks, chunks)  # and the time it shows went on while the build could not run Python
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text)
    said = (
        ["==> compile: 1 candidate(s)", "ticks while held"] + [f"line {n}\r\n" for n in range(50)] + ["compile done in"]
    )
    at = [plain.find(line) for line in said]
    assert -1 not in at and at == sorted(at), at  # every line, in the order the build printed it
    assert shows_the_cursor_at_the_end(text), text


def test_renderer_ends_when_the_build_is_killed_even_if_a_forked_child_holds_its_pipe(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_WHILE_LIVE))
    code, text, _, marks = on_terminal(
        [sys.executable, str(script), "{marks}"], until="forked", then=lambda process, marks: process.kill()
    )
    forked, renderer = int(marks["forked"][0][0]), int(marks["forked"][0][2])
    try:
        assert code == -signal.SIGKILL, text
        assert gone(renderer), "the renderer outlived the build"
        assert "before the kill" in text and shows_the_cursor_at_the_end(text), text
    finally:
        os.kill(forked, signal.SIGKILL)


def test_ctrl_c_in_live_mode_ends_the_renderer_after_the_build_s_last_line(tmp_path):
    renderers: list[int] = []

    def ctrl_c(process, marks):
        time.sleep(1.0)  # inside AOTInductor now
        renderers.extend(renderers_of(process.pid))
        os.killpg(process.pid, signal.SIGINT)  # what the terminal sends its foreground process group

    code, text, _, _ = on_terminal(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            "--spec",
            str(TINY_SPEC),
            "--root",
            str(tmp_path / "opt"),
            "--dist",
            str(tmp_path / "dist"),
            "--build-dir",
            str(tmp_path / "build"),
        ],
        until="==> compile",
        then=ctrl_c,
    )
    assert code == BuildInterrupted.exit_code, text
    assert len(renderers) == 1 and gone(renderers[0]), renderers
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text  # the renderer ignored the SIGINT
    error = text.index("error: build stopped by SIGINT")
    assert shows_the_cursor_at_the_end(text[:error]) and "in all" not in text[error:], text


def test_stdout_sent_elsewhere_stays_there_while_the_status_is_live(tmp_path):
    """`matrix > file` on a terminal: the JSON goes to the file, not above the status area."""
    out = tmp_path / "matrix.json"
    code, text, _, _ = on_terminal(["sh", "-c", f'exec "$0" -m pipeline matrix > {out}', sys.executable])
    assert code == 0, text
    assert json.loads(out.read_text()) and "include" not in text, text


# In a pipe: a stage whose model call holds the GIL for 3 s, status lines every half second.
PLAIN_HOLD = """
    import ctypes, sys
    from pipeline.services.live_progress import for_stream

    progress = for_stream(sys.stderr)
    with progress.stage("verify"):
        progress.step("case large")
        progress.say("hold")
        ctypes.PyDLL(None).usleep(3_000_000)  # the GIL held through the call, as AOTInductor's runner holds it
        progress.say("held")
    progress.close()
"""


def test_in_a_pipe_status_lines_come_while_a_c_call_holds_the_gil(tmp_path):
    """Verifying the unet on a loaded 2-core machine left 16-18 s between lines: each model call
    of the runner holds the GIL, and the thread that printed the status waited for it."""
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(PLAIN_HOLD))
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env={**os.environ, STATUS_ENV: "0.5"}
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines[0] == "==> verify" and lines[-1].startswith("    verify done in "), lines
    during = lines[lines.index("hold") + 1 : lines.index("held")]
    assert len(during) >= 3, lines  # about six; a thread of the build's process printed none
    status = r"    \.\.\. verify case large · \ds in verify · \ds in all"
    assert all(re.fullmatch(status, line) for line in during), during
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", ran.stderr), ran.stderr  # no control characters in a pipe


def test_the_live_area_says_the_time_left_in_its_own_row_without_its_basis(monkeypatch):
    """In one row, 'compile 2/3 freezing, 3/3 freezing+channels-last: compiling, 2 at a time · 45s in
    compile · 54s in all · about 1m00s left of compile (from this build's compiles and noise rounds);
    no figure yet …' was cut before its figure on an 80-column terminal, and beside the times,
    '… · compile stage finishing, at the revised esti' was; the scrolled lines say the basis."""
    from pipeline.services import live
    from pipeline.services.wording import FIRST_COMPILE, brief, part_only

    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    status = live.Status(began=955.0)
    status.apply({"stage": "compile", "began": 991.0})
    status.apply({"step": "2/3 freezing, 3/3 freezing+channels-last: compiling, 2 at a time"})
    status.apply({"stage_end": 1060.0, "basis": "from this build's compiles and noise rounds"})
    assert status.area().split("\n") == [
        "compile 2/3 freezing, 3/3 freezing+channels-last: compiling, 2 at a time",
        "  9s in compile · 45s in all",
        "  about 1m00s left of compile",
    ]
    assert "(from this build's compiles and noise rounds)" in status.line()  # the scrolled status keeps it
    clock[0] = 1070.0  # past it, then a new estimate: the build says it is a revised one (Progress.estimate)
    assert status.area().endswith("\n  running 10s past the estimate")  # the row above names the stage
    status.apply({"stage_end": 1070.2, "basis": None, "revised": True})
    assert status.area().endswith("\n  finishing, at the revised estimate"), status.area()
    # the next figure came back with 2 s to go: still "finishing" (progress.held(); H53)
    status.apply({"stage_end": 1072.0, "basis": None, "revised": True, "finishing": True})
    assert status.area().endswith("\n  finishing, at the revised estimate"), status.area()
    status.apply({"stage_end": 1100.0, "basis": "from this build's compiles", "revised": True})
    assert status.area().endswith("\n  about 30s left of compile, revised"), status.area()
    clock[0] = 4000.0  # minutes in: every row still fits 80 columns
    assert all(len(row) <= 80 for row in status.area().split("\n")), status.area()
    # a part's figure says the part: "about 2s left of compile" was the first candidate's verification,
    # said on a terminal 3 minutes before the stage ended
    part = part_only("the first candidate's verification") + "from its cases so far"
    status.apply({"stage_end": 4002.0, "basis": part, "revised": False})
    assert status.area().endswith("\n  about 2s left of the first candidate's verification"), status.area()
    assert brief(
        "about 27s left of the build: 20s of compile (revised, from this build's compiles), then 7s for the stages "
        "after it (from earlier builds)"
    ) == ("about 27s left of the build: 20s of compile, revised, then 7s for the later stages")
    assert brief(
        "about 56s left of the first compile (a first guess from the graph's 734 ops); the stage's figure"
    ) == ("about 56s left of the first compile")
    assert FIRST_COMPILE == part_only("the first compile")


def test_a_row_too_wide_for_the_terminal_ends_in_an_ellipsis(monkeypatch):
    """'about 29s left of the build: 11s of compile, revised, then 18s for the later s' (86
    characters on an 80-column terminal) was cut mid-word with no mark (H41)."""
    import io

    from rich.console import Console

    from pipeline.services import live

    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    status = live.Status(began=955.0)
    status.apply({"stage": "compile", "began": 991.0})
    status.apply({"step": "1/4 spec-options: compiling"})
    status.apply({"stage_end": 1029.0, "basis": "from this build's compiles", "revised": True})
    console = Console(file=io.StringIO(), width=40)
    rows = ["".join(s.text for s in line).rstrip() for line in console.render_lines(status.render(), console.options)]
    assert len(rows) == 3 and all(len(row) <= 40 for row in rows), rows
    assert rows[0].startswith(("⠋ compile 1/4 spec-options: compiling", "⠙ compile 1/4")), rows
    assert rows[2] == "  about 29s left of compile, revised", rows  # it fits: no cut
    status.apply({"step": "2/3 freezing, 3/3 freezing+channels-last: compiling, 2 at a time"})
    rows = ["".join(s.text for s in line).rstrip() for line in console.render_lines(status.render(), console.options)]
    assert len(rows) == 3 and rows[0].endswith("…") and len(rows[0]) <= 40, rows
    # cut at a word: 'then 36s for the later s…' read as cut mid-word (H42)
    assert rows[0][2:] == "compile 2/3 freezing, 3/3…", rows
    assert live.cut_at_word(
        "about 45s left of the build: 9s of compile, revised, then 36s for the later stages", 80
    ) == ("about 45s left of the build: 9s of compile, revised, then 36s for the later…")
    assert live.cut_at_word(
        "about 45s left of the build: 9s of compile, revised, then 36s for the later stages", 70
    ) == ("about 45s left of the build: 9s of compile, revised, then 36s for the…")
    assert live.cut_at_word("then 36s for the later", 22) == "then 36s for the later"  # fits exactly
    assert live.cut_at_word("then 36s for the later stages", 22) == "then 36s for the…"
    assert live.cut_at_word("supercalifragilistic", 8) == "superca…"  # one long word: cut in it


def test_the_stage_row_is_cleared_before_its_done_line():
    """H48: the renderer got a stage's "done" line, drew the stage's row again under it, and only then
    heard the stage was over: captured logs showed the stage going on after it said done."""
    from pipeline.services.live_progress import LiveProgress

    sent: list[dict] = []

    class Recorded(LiveProgress):
        def _send(self, **message: object) -> bool:
            sent.append(message)
            return True

    with open(os.devnull, "w") as devnull:
        display = Recorded(devnull)
        display.started = True  # no renderer process: the messages it would get are recorded
        with display.stage("doctor"):
            pass
    ended = next(n for n, message in enumerate(sent) if message == {"stage": None})
    done = next(n for n, message in enumerate(sent) if str(message.get("say", "")).startswith("    doctor done in "))
    assert ended < done, sent
