"""Every command a newcomer copies from README.md and docs/quickstart.md is one the tools take:
parsed by the parser that would run it (modelwheel's, make's with -n, pip's), never run (a build
takes minutes), with the names it relies on checked (the model's version, a task, a spec path)."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from pipeline.arguments import parser

from .conftest import REPO

PAGES = [REPO / "README.md", REPO / "docs" / "quickstart.md"]
COMMANDS = ("make", "pip", "python", "modelwheel", ".venv/bin/modelwheel", ".venv/bin/python")
SHELL_LANGUAGES = ("", "sh", "bash", "shell", "console")
# the pages' stand-ins for a model of the reader's own (`make build MODEL=x`)
PLACEHOLDERS = ("models/x/", "models/other/", "path/to/")


def code_block_lines(text: str) -> list[str]:
    """The lines of the page's code blocks: indented ones, and fenced ones in a shell language."""
    lines, found, fence, previous_blank = text.splitlines(), [], None, True
    in_indented = False
    for line in lines:
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence is not None:
            if fence in SHELL_LANGUAGES:
                found.append(line)
            continue
        if line.startswith("    ") and (previous_blank or in_indented):
            found.append(line.strip())
            in_indented = True
        elif line.strip():
            in_indented = False
        previous_blank = not line.strip()
    return found


def inline_commands(text: str) -> list[str]:
    """`make …` and `modelwheel …` spans in the prose: commands too."""
    return [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith(("make ", "modelwheel "))]


def commands(page) -> list[list[str]]:
    text = page.read_text()
    found = []
    for line in code_block_lines(text) + inline_commands(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words and words[0] in COMMANDS:
            # a usage line's optional flags (`[--root DIR]`) are flags too; `…` stands for more of the same
            found.append([w.strip("[]") for w in words if w not in ("…", "...")])
    return found


ALL = [(page.name, words) for page in PAGES for words in commands(page)]


def test_the_pages_show_the_commands_a_newcomer_runs():
    shown = {(page, words[0]) for page, words in ALL}
    assert {
        ("README.md", "make"),
        ("README.md", "pip"),
        ("README.md", "modelwheel"),
        ("quickstart.md", "make"),
        ("quickstart.md", ".venv/bin/modelwheel"),
    } <= shown, shown


def check_modelwheel(args: list[str]) -> None:
    if {"--help", "-h"} & set(args) or args == ["--version"]:  # print and exit 0: nothing to parse after them
        return
    try:
        parsed = parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"modelwheel's parser refuses: modelwheel {' '.join(args)}")
    if getattr(parsed, "task", None):
        from pipeline.hf_tasks import find_task

        assert find_task(parsed.task) is not None, f"no task {parsed.task!r}: modelwheel {' '.join(args)}"


def check_make(args: list[str]) -> None:
    ran = subprocess.run(["make", "-n", "--no-print-directory", *args], capture_output=True, text=True, cwd=REPO)
    assert ran.returncode == 0, f"make -n {' '.join(args)}: {ran.stderr}"
    for line in ran.stdout.splitlines():  # what make would run of modelwheel's, parsed in turn
        words = line.split()
        if words[1:3] != ["-m", "pipeline"]:
            continue
        words = shlex.split(line)
        check_modelwheel(words[3:])
        specs = [words[i + 1] for i, word in enumerate(words) if word == "--spec"]
        for spec in specs:
            assert spec.startswith(PLACEHOLDERS) or (REPO / spec).is_file(), (
                f"make {' '.join(args)} builds {spec}, which is not there"
            )


# pip's parser runs in a process of its own: importing pip turns off setuptools' distutils shim for
# the rest of the process (_distutils_hack), and a later test importing setuptools (through
# torch.utils.cpp_extension) then fails its assertion that distutils is setuptools' own.
PIP_PARSE = (
    "import json, sys\nfrom pip._internal.commands import create_command\n"
    "print(json.dumps(create_command('install').parse_args(sys.argv[1:])[1]))"
)


def check_pip(args: list[str]) -> None:
    assert args[0] == "install", args
    parsed = subprocess.run([sys.executable, "-c", PIP_PARSE, *args[1:]], capture_output=True, text=True)
    if parsed.returncode != 0:
        pytest.fail(f"pip's parser refuses: pip {' '.join(args)}\n{parsed.stderr}")
    requirements = json.loads(parsed.stdout)
    unet = tomllib.loads((REPO / "models" / "unet" / "spec.toml").read_text())["model"]
    for requirement in requirements:
        wheel = re.fullmatch(r"dist/model_(\w+)-([\d.]+)\*\.whl", requirement)
        if wheel:  # the wheel `make build MODEL=unet` makes: its name and version are the spec's
            assert wheel.groups() == (unet["name"], unet["version"]), requirement


def check_python(args: list[str]) -> None:
    if args[:1] == ["-c"]:
        ast.parse(args[1])  # a SyntaxError fails the test
        unet = tomllib.loads((REPO / "models" / "unet" / "spec.toml").read_text())["model"]
        imported = re.findall(r"import (model_\w+)", args[1])
        assert all(name == f"model_{unet['name']}" for name in imported), args[1]
    elif args[:2] == ["-m", "pipeline"]:
        check_modelwheel(args[2:])


@pytest.mark.parametrize("page, words", ALL, ids=[f"{page}: {' '.join(words)[:60]}" for page, words in ALL])
def test_each_command_is_one_its_tool_takes(page, words):
    tool, args = words[0], words[1:]
    if tool in ("modelwheel", ".venv/bin/modelwheel"):
        check_modelwheel(args)
    elif tool == "make":
        check_make(args)
    elif tool == "pip":
        check_pip(args)
    else:
        check_python(args)


def build_flags_shown() -> dict[tuple[str, ...], str]:
    """docs/quickstart.md's flag table for `build`: its flags (`-j`, `--jobs`) -> the default cell."""
    text = (REPO / "docs" / "quickstart.md").read_text()
    table = text.split("| flag | default | meaning |\n| --- | --- | --- |\n")[1].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()]
    return {tuple(re.findall(r"`(-[-\w]+)`", row[0])): row[1] for row in rows}


def test_the_quickstart_flag_table_is_the_build_commands_flags():
    """The table lacked --hf, --task, --name, -j and --update-lock, which `build --help` shows."""

    build = next(
        action.choices["build"] for action in parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    shown_by_help = [a for a in build._actions if a.option_strings and a.help != argparse.SUPPRESS]
    flags = {tuple(action.option_strings) for action in shown_by_help} - {("-h", "--help")}
    shown = build_flags_shown()
    assert sorted(flags - set(shown)) == [], "flags `modelwheel build --help` shows that the table leaves out"
    assert sorted(set(shown) - flags) == [], "flags in the table that `modelwheel build` does not take"


def test_the_quickstart_flag_table_does_not_call_spec_required():
    """With --hf the spec is optional (keys that override the checkpoint's), so it is not `(required)`."""
    assert "(required)" not in build_flags_shown()[("--spec",)]
    parsed = parser().parse_args(["build", "--hf", "folder", "--task", "image-classification", "--name", "x"])
    assert parsed.spec in (None, []) and parsed.hf == "folder"


def test_every_option_of_every_command_says_what_it_is_for():
    """A newcomer's `publish --help` listed --dist, --root and --build-dir with no text: whether
    publish needed the build's --root could only be read in the code."""
    bare = [
        f"{name} {'/'.join(action.option_strings)}"
        for top in parser()._actions
        if isinstance(top, argparse._SubParsersAction)
        for name, command in top.choices.items()
        for action in command._actions
        if action.option_strings and not action.help and action.help != argparse.SUPPRESS
    ]
    assert not bare, bare


def test_every_commands_help_says_where_the_docs_it_names_are():
    """The tool installed with pip has no docs/ beside it: a newcomer looked for the
    docs/how-a-build-works.md its `build --help` named."""
    commands = next(top for top in parser()._actions if isinstance(top, argparse._SubParsersAction)).choices
    said = [" ".join(command.format_help().split()) for command in [parser(), *commands.values()]]
    note = "docs/… names a guide in modelwheel's source repository (the docs folder of its checkout)."
    assert all(text.endswith(note) for text in said), said


def test_make_alone_says_what_to_type():
    """A newcomer's `make` said only "Nothing to be done for 'venv'"."""
    ran = subprocess.run(["make", "--no-print-directory"], cwd=REPO, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("make build MODEL=unet ") and lines[1].startswith("make test "), lines
