"""A fresh virtualenv that sees this interpreter's torch, for a wheel installed with --no-deps on a
GPU image with no network to fetch another torch.

`python -m venv --system-site-packages` is not enough where this interpreter is itself a
virtualenv (the GPU image's /opt/torch/.venv): the new one sees the *base* Python's
site-packages, not this one's, and `import torch` fails there (seen on an H200, 2026-11-25). A
.pth file listing this interpreter's site folders makes them visible, after the new venv's own.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def create(path: Path) -> Path:
    """The virtualenv at ``path`` (cleared first); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(path)], check=True)
    python = path / "bin" / "python"
    if sys.prefix != sys.base_prefix:  # this interpreter is a venv: hand its packages on
        own = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        folders = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        Path(own, "_parent_site.pth").write_text("".join(f"{folder}\n" for folder in folders))
    return python
