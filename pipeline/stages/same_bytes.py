"""What keeps a compile's bytes the same from one process to the next: Inductor writes into the
generated sources, whose hashed names the .so keeps, two things that differ per process. Private
hooks, like compile.torch_seen_at(): where a torch lacks one, there is nothing to patch."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a Python object's address, in its default repr

# oneDNN 3's memory descriptor as torch serializes it (772 bytes; an int, ndims, the dims, data_type
# at 104, ..., format_kind at 312): the 4 bytes after data_type and after format_kind only align
# the 8-byte fields after them, and hold whatever the memory held (0x7f8f, then 0x7f71, in two builds).
MKLDNN_MD_SIZE = 772
MKLDNN_MD_PADDING = ((108, 112), (316, 320))
OPAQUE_METADATA = ".opaque_metadata = {"  # how Inductor writes a descriptor into the sources


@contextlib.contextmanager
def op_names_without_addresses() -> Iterator[None]:
    """Inductor names each extern kernel in its size asserts' messages, and a kernel that
    freezing's pattern matcher made is named by the repr of a ``functools.partial``, which holds
    a function's address (``<function …fn at 0x7f722ca3b2e0>``): another in every process. The
    generated sources carry those strings, and are named by a hash of their text, so every
    compile of a frozen model gave a .so of other bytes (`modelwheel reproduce` said so, exit 28).
    The names lose the address; a torch without the hook has nothing to patch."""
    from torch._inductor import ir

    original = getattr(ir.ExternKernel, "get_op_name", None)
    if original is None:
        yield
        return

    def without_address(kernel: Any) -> str:
        return ADDRESS.sub("", original(kernel))

    ir.ExternKernel.get_op_name = without_address  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ir.ExternKernel.get_op_name = original  # type: ignore[method-assign]


@contextlib.contextmanager
def mkldnn_metadata_without_padding() -> Iterator[None]:
    """A frozen model's packed weights (oneDNN tensors) are recreated at load from their memory
    descriptors, which the generated sources carry as bytes, padding included: the unet's search
    compiled its choice in a worker, `reproduce` in its own process, and 33 of its 202 descriptors
    differed there, so the .so did. The padding is zeroed in the lines Inductor wrote (not in the
    operator that serializes them: torch's own code reaches it through torch.ops and wants it as it
    is); a descriptor of another size is left as is, and a torch without the hook has nothing to patch."""
    from torch._inductor.codegen import cpp_wrapper_cpu

    wrapper = cpp_wrapper_cpu.CppWrapperCpu
    constructor = wrapper.__dict__.get("codegen_model_constructor")
    if constructor is None:
        yield
        return

    def constructor_without_padding(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = constructor(self, *args, **kwargs)
        lines = getattr(getattr(self, "prefix", None), "_lines", [])
        for index, line in enumerate(lines):
            if isinstance(line, str) and OPAQUE_METADATA in line:
                lines[index] = _without_padding(line)
        return done

    wrapper.codegen_model_constructor = constructor_without_padding  # type: ignore[method-assign]
    try:
        yield
    finally:
        wrapper.codegen_model_constructor = constructor  # type: ignore[method-assign]


def _without_padding(line: str) -> str:
    """``constants_info_[3].opaque_metadata = {1L, 0L, …};`` with the descriptor's padding bytes 0."""
    head, _, values = line.partition(OPAQUE_METADATA)
    serialized = values.removesuffix("};").split(", ")
    if len(serialized) != MKLDNN_MD_SIZE:
        return line
    for start, end in MKLDNN_MD_PADDING:
        serialized[start:end] = ["0L"] * (end - start)
    return head + OPAQUE_METADATA + ", ".join(serialized) + "};"
