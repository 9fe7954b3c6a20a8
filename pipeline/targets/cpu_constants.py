"""The CPU target's part of the shared constants store (stages/constants.py): its packed weights.

Freezing, which gives static batch sizes their speed, packs convolution and linear weights into
oneDNN's blocked layouts (torch's mkldnn tensors), which is also why AOTInductor's own ways to
keep constants outside the .so cannot hold them (``package_constants_on_disk_format =
"pickle_weights"`` raises NotImplementedError on oneDNN tensors). Such a tensor has no strides or
storage to read: it is stored as its bytes and oneDNN's memory descriptor, from which the wheel
makes it again (runtime/_target_cpu.py's CONSTANT_LAYOUTS, through torch's C shim). Measured on
the UNet (models/unet), the packed constants of batch sizes 1, 2, 4 and 8 were byte-identical.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

LAYOUT = "mkldnn"  # the store's name for it: the runtime's CONSTANT_LAYOUTS key


def packed(tensor: torch.Tensor) -> tuple[bytes, dict[str, Any]] | None:
    """A oneDNN tensor's bytes and its store entry (``md``: its memory descriptor); None for any other."""
    if not tensor.is_mkldnn:
        return None
    size = torch.ops.mkldnn._nbytes(tensor)
    data = bytes((ctypes.c_ubyte * size).from_address(torch.ops.mkldnn.data_ptr(tensor))) if size else b""
    md = bytes(torch.ops.mkldnn._get_mkldnn_serialized_md(tensor).numpy())
    return data, {
        "layout": LAYOUT,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "stride": [0] * tensor.dim(),
        "offset": 0,
        "md": md,
    }
