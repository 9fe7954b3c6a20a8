"""The model as the bench's other contenders run it, from one export made as the build makes it:
a .pt2 (aoti_compile_and_package), a bare .so (aot_compile) and an ONNX file, each compiled with
the wheel's options and graph passes (bench.py and bench_cuda.py time them against the wheel).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from benchmarks import step
from pipeline import targets as build_targets
from pipeline.stages import precision
from pipeline.stages.export import dynamic_shapes, export_program, prepare
from pipeline.stages.loader import load_model


def export_once(spec_file, target: str = build_targets.DEFAULT):
    """The model exported as the build exports it: every compile below starts from this."""
    loaded = load_model(spec_file)
    return export_program(prepare(spec_file, loaded, build_targets.get(target)), loaded.source_files)


def program_for(exported, compile_options: dict) -> tuple:
    """The exported program for these compile options (under autocast if they say so), and the
    Inductor options among them."""
    autocast, options = precision.split_options(compile_options)
    program = precision.export_autocast(exported, autocast) if autocast else exported.program
    options = {k: v for k, v in options.items() if not k.startswith("aot_inductor.package")}
    return program, {**options, **exported.target.graph_passes(options)}


def make_pt2(exported, manifest: dict, out: Path) -> Path:
    program, options = program_for(exported, manifest["compile_options"])
    path = out / "model.pt2"
    with step("pt2", "compiling the same model to a .pt2 (aoti_compile_and_package, the wheel's options)"):
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return path


def compile_so(exported, compile_options: dict, path: Path) -> Path:
    program, options = program_for(exported, compile_options)
    shutil.rmtree(path.parent, ignore_errors=True)
    path.parent.mkdir(parents=True)
    with torch.no_grad():
        torch._inductor.aot_compile(
            program.module(), exported.example_inputs, options={**options, "aot_inductor.output_path": str(path)}
        )
    return path


def make_onnx(exported, out: Path) -> Path:
    path = out / "model.onnx"
    with step("onnx", "exporting to ONNX (torch.onnx.export, dynamo)"):
        program = torch.onnx.export(
            exported.module, exported.example_inputs, dynamo=True, dynamic_shapes=dynamic_shapes(exported.spec_file)
        )
        if program is None:  # dynamo=True returns the program (None is the legacy exporter's)
            raise SystemExit("bench: torch.onnx.export returned no program")
        program.save(str(path))
    return path
