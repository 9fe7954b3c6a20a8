"""``python -m pipeline``: the ``modelwheel`` command, importing a spec's factory from the same places.

``python -m`` puts the current directory first on ``sys.path``; the installed command does not. It is
dropped here: a newcomer's ``python -m pipeline build --spec <copy elsewhere>`` imported the factory
from the checkout he stood in, where ``modelwheel`` said "No module named 'models'" (H45); and a
folder one merely stands in (another user's /tmp) is never imported from. This package is imported
already, so its own modules still load (factory_import.import_roots says where a factory comes from).
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .entry import run  # noqa: E402 (after the path is set: nothing of the current directory imported)

run()
