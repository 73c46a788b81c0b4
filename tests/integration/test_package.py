"""What `import slurmrt` does in a fresh interpreter: no logging configured, no torch or numpy imported."""

from __future__ import annotations

import logging
import subprocess
import sys


def test_import_slurmrt_imports_neither_torch_nor_numpy() -> None:
    code = "import sys, slurmrt; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_configures_no_logging() -> None:
    code = ("import logging, slurmrt; root = logging.getLogger(); lib = logging.getLogger('slurmrt');"
            "print(root.handlers, lib.level, lib.handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"[] {logging.NOTSET} []"
