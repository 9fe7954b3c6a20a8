"""A compiled PyTorch model packaged by modelwheel.

    model = load()                       # opens the AOTInductor .so (through its /opt link)
    outputs = model(*example_inputs())   # tensors in, tensors out
    manifest()                           # torch version, target, input specs, tolerances, hashes
"""

from ._load import ArtifactLinkWarning, CompiledModel, IncompatibleRuntime, example_inputs, load, manifest

__all__ = ["ArtifactLinkWarning", "CompiledModel", "IncompatibleRuntime", "example_inputs", "load", "manifest"]
__version__ = manifest()["full_version"]
