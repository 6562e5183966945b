"""The torchvision suite runs only where torchvision is installed (``make test-torchvision``).

torchvision 0.29.1 needs torch 2.14.1, which cannot sit beside the CPU torch of
``.venv``; ``make test`` runs this folder in ``.venv-torchvision`` after the
main run, and the main run leaves it out.
"""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torchvision") else ["test_*.py"]
