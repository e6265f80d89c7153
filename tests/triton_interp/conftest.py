"""Tests that run Triton kernels on the CPU under Triton's interpreter. The interpreter is chosen when
triton is imported, for the whole process, so these run in a process of their own:
tests/test_triton.py starts `TRITON_INTERPRET=1 python -m pytest tests/triton_interp` (and the main
session does not collect this folder: tests/conftest.py)."""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    raise pytest.UsageError("tests/triton_interp needs TRITON_INTERPRET=1 (tests/test_triton.py runs it so)")
pytest.importorskip("triton", reason="triton is not installed (pip install 'argosy[gpu]'; .ci/run installs it)")
