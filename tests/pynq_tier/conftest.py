"""The pynq tier (``make test-pynq``): collected only where the real ``pynq`` package imports (its own virtual
environment, ``.venv-pynq``: pynq pins numpy < 2, so it never enters the development environment).

The folder is not called ``pynq``: with ``tests/`` on ``sys.path`` (the root conftest) a ``tests/pynq`` folder
imports as a namespace package ``pynq`` where the real one is missing."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("pynq") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # the command-behaviour mocks of the host tests (tests/host/mock_accelerator.py) sit behind the mock devices
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
