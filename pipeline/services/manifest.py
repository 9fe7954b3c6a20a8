"""The manifest's helpers every layer may use: its file hashes and its JSON.
Its type is the runtime's (runtime/_schema.py); the package stage makes it (stages/manifest.py).
"""

from __future__ import annotations

import json

from ..wheel_template.runtime import _integrity as wheel_integrity
from ..wheel_template.runtime._schema import Manifest

# The wheel's own integrity check hashes files the same way.
sha256_file = wheel_integrity.sha256_file


def dumps(manifest: Manifest) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"
