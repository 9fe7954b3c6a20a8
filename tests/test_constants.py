"""The shared constants store (pipeline/stages/constants.py, runtime/_constants.py) keeps a layout of
a target's own (the CPU's oneDNN-packed weights) through that target's two files only: the build
side's packed_constant writes it, the runtime side's CONSTANT_LAYOUTS makes it again."""

from __future__ import annotations

import pytest
import torch

from pipeline import targets
from pipeline.stages import constants
from pipeline.wheel_template.runtime import _constants as wheel_constants
from pipeline.wheel_template.runtime import _targets as wheel_targets


@pytest.fixture
def store(tmp_path):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN: no packed tensor to store")
    weight, bias = torch.randn(8, 4), torch.randn(8)
    writer = constants.Writer()
    writer.add("model.so", {"weight": weight.to_mkldnn(), "bias": bias}, targets.get("cpu"))
    writer.write(tmp_path)
    return tmp_path, {"weight": weight, "bias": bias}


def test_a_packed_weight_comes_back_through_the_cpu_targets_layouts(store):
    folder, tensors = store
    layouts = wheel_targets.constant_layouts(targets.runtime(targets.get("cpu")))
    opened = wheel_constants.Store(folder, layouts)  # kept: the tensors read its mapped file
    made = opened.tensors("model.so")
    assert made["weight"].is_mkldnn and not made["bias"].is_mkldnn
    assert torch.equal(made["weight"].to_dense(), tensors["weight"])
    assert torch.equal(made["bias"], tensors["bias"])


def test_a_store_whose_layout_the_target_lacks_is_refused_naming_it(store):
    folder, _ = store
    runtime = targets.runtime(targets.get("cuda"))  # its constants stay in each .so: no layouts of its own
    with pytest.raises(RuntimeError, match="constant 'weight' of model.so is in layout 'mkldnn', which this wheel"):
        wheel_constants.Store(folder, wheel_targets.constant_layouts(runtime)).tensors("model.so")
