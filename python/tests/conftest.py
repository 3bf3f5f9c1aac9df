import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)


def run_python(code, env=None):
    """Runs `code` in a fresh interpreter (stowage's process-wide state and first-error line are
    per process); returns the CompletedProcess."""
    full = dict(os.environ)
    full["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)


@pytest.fixture
def python():
    return run_python
