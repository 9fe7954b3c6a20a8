"""The package stage's manifest: the wheel's ``manifest.json``, of the one type the runtime reads
(runtime/_schema.py's ``Manifest``), made from the stages' records.

Nothing in it depends on when or where the build ran (beyond the artifact root), so two builds
of the same inputs give the same bytes.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import cast

import torch

from .. import targets
from ..errors import PackageError
from ..hf import checkpoint_record
from ..services.manifest import sha256_file
from ..wheel_template.runtime import _weights as wheel_weights
from ..wheel_template.runtime._schema import FORMAT, Checkpoint, CompileSearch, Input, Manifest, TensorRecord, Weights
from .compile import Compiled
from .export import Exported, export_sizes, spec_inputs
from .loader import weight_tensors
from .verify import Verified


def local_label(target: str) -> str:
    """Tells wheels of one model version apart by target and torch build: ``cpu.torch2.13.0``,
    ``cu130.torch2.11.0``."""
    return f"{targets.get(target).index_variant()}.torch{torch.__version__.split('+')[0]}"


def full_version(version: str, target: str) -> str:
    """The wheel's version: the model's, with the local label (``1.3+cpu.torch2.13.0``)."""
    return f"{version}+{local_label(target)}"


def build_manifest(exported: Exported, compiled: Compiled, verified: Verified, search: CompileSearch) -> Manifest:
    """``search``: the option search as it ran (build.py's search_record)."""
    spec = exported.spec_file.spec
    example = export_sizes(exported.spec_file)
    target = targets.get(compiled.target)
    facts = target.manifest_facts(compiled)  # "platform", and the target's own sections (a CUDA wheel's cuda section)
    manifest = Manifest(
        format=FORMAT,
        name=spec.model.name,
        dist_name=spec.dist_name,
        import_name=spec.import_name,
        version=spec.model.version,
        full_version=full_version(spec.model.version, compiled.target),
        description=spec.model.description,
        license=spec.model.license,
        urls=dict(spec.model.urls),
        # The runtime opens the model through its target's module (runtime/_targets.py) and
        # places tensors on the device kind.
        target=compiled.target,
        device=target.DEVICE,
        # publish reads the index the wheel goes to without importing torch
        variant=target.index_variant(),
        torch={"version": torch.__version__, "distribution": importlib.metadata.version("torch")},
        platform=facts["platform"],
        opt_path=str(compiled.output_dir),
        # Whether the .so runs from wherever it is installed (CPU), or must be reached at opt_path,
        # where it was compiled (CUDA: its kernels are addressed by absolute path): the runtime
        # makes the link only then.
        relocatable=target.RELOCATABLE,
        library=compiled.library.name,
        artifacts={
            path.name: {
                "sha256": as_verified(path, loaded_sha256(path, compiled, verified)),
                "size": path.stat().st_size,
            }
            for path in compiled.artifacts
        },
        inputs=cast(list[Input], spec_inputs(exported.spec_file)),
        dims={name: {"min": d.min, "max": d.max, "example": example[name]} for name, d in spec.dims.items()},
        outputs=[
            {
                "name": o.name,
                "dtype": dtype,
                "rtol": verified.tolerances[o.name].rtol,
                "atol": verified.tolerances[o.name].atol,
            }
            for o, dtype in zip(spec.outputs, exported.output_dtypes)
        ],
        returns_tuple=exported.returns_tuple,
        weights=_weights_record(exported, verified),
        golden={
            "file": verified.golden_file.name,
            "sha256": sha256_file(verified.golden_file),
            "size": verified.golden_file.stat().st_size,
            "cases": list(verified.golden_cases),
        },
        # Only a verified build reaches packaging; publish refuses a wheel without this record.
        verification={"passed": True, "reference": verified.reference, "cases": [c.case for c in verified.cases]},
        compile_options=compiled.options,
        compile_cache_key=compiled.cache_key,
        compile_search=search,
        content_hash=exported.content_hash,
    )
    # A build from a save_pretrained folder names it, and its config.json's hash (issue 30).
    if (record := checkpoint_record(spec)) is not None:
        manifest["checkpoint"] = cast(Checkpoint, record)
    return cast(Manifest, {**facts, **manifest})


def loaded_sha256(path: Path, compiled: Compiled, verified: Verified) -> str | None:
    """The sha256 verification loaded ``path`` with: the .so's (None for the files it did not open)."""
    return verified.library_sha256 if path == compiled.library else None


def as_verified(path: Path, loaded: str | None) -> str:
    """The file's sha256, which must be ``loaded``, that of the bytes verification loaded from it
    (None: a file verification did not open)."""
    digest = sha256_file(path)
    if loaded is not None and loaded != digest:
        raise PackageError(
            f"{path} changed after it was verified (sha256 {loaded[:16]}… loaded, {digest[:16]}… now)",
            "another process wrote into the build's output folder: build again, into a root only you can write",
        )
    return digest


def _weights_record(exported: Exported, verified: Verified) -> Weights:
    record = Weights(external=verified.weights_file is not None, sha256=exported.weights_sha256)
    if verified.weights_file is not None:
        record["file"] = verified.weights_file.name
        record["file_sha256"] = sha256_file(verified.weights_file)
        record["size"] = verified.weights_file.stat().st_size
        record["tensors"] = cast(dict[str, TensorRecord], wheel_weights.describe(weight_tensors(exported.module)))
    return record
