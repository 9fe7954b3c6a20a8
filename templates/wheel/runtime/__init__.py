"""A compiled PyTorch model packaged by modelwheel.

    model = load()                       # opens the AOTInductor .so (through its /opt link)
    outputs = model(*example_inputs())   # tensors in, tensors out
    manifest()                           # torch version, target, input specs, tolerances, hashes
    verify()                             # re-run the golden cases recorded at build time
    load(weights="finetune.safetensors") # other weights, when built with [weights] external = true
    model.swap_weights("v2.safetensors") # switch weights in place, without downtime
"""

from ._golden import GoldenMismatch
from ._integrity import IntegrityError
from ._load import ArtifactLinkWarning, CompiledModel, IncompatibleRuntime, example_inputs, load, manifest, verify
from ._weights import WeightsMismatch

__all__ = [
    "ArtifactLinkWarning",
    "CompiledModel",
    "GoldenMismatch",
    "IncompatibleRuntime",
    "IntegrityError",
    "WeightsMismatch",
    "example_inputs",
    "load",
    "manifest",
    "verify",
]
__version__ = manifest()["full_version"]
