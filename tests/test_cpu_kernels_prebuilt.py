"""CPU kernels prebuilt for a named target (what the container image carries): built without
-march=native, loaded from ARGOSY_CPU_KERNELS_LIB with no compiler on PATH, and refused (plain PyTorch,
a warning) on a CPU that lacks the target's instructions instead of dying with SIGILL."""

from __future__ import annotations

import logging

import pytest
import torch

from argosy.engine import cpu_kernels


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    return cpu_kernels.build_for_target(tmp_path_factory.mktemp("kernels"), "x86-64-v2")


def load(monkeypatch, lib, flags=None):
    monkeypatch.setenv("ARGOSY_CPU_KERNELS_LIB", str(lib))
    monkeypatch.setenv("PATH", "/nonexistent")  # no compiler: the prebuilt library or nothing
    monkeypatch.delenv("CC", raising=False)
    if flags is not None:
        monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: flags)
    cpu_kernels._library.cache_clear()


def test_the_prebuilt_library_loads_without_a_compiler_and_computes(monkeypatch, prebuilt):
    assert prebuilt.with_suffix(".target").read_text().strip() == "x86-64-v2"
    try:
        load(monkeypatch, prebuilt)
        assert cpu_kernels.available()
        w, x = torch.randn(64, 32), torch.randn(1, 32)
        torch.testing.assert_close(cpu_kernels.matvec(w, x), x @ w.T, rtol=1e-5, atol=1e-5)
    finally:
        monkeypatch.undo()
        cpu_kernels._library.cache_clear()


def test_a_cpu_without_the_target_s_instructions_keeps_pytorch(monkeypatch, prebuilt, caplog):
    (prebuilt.parent / "v4.so").write_bytes(prebuilt.read_bytes())
    (prebuilt.parent / "v4.target").write_text("x86-64-v4\n")
    try:
        load(monkeypatch, prebuilt.parent / "v4.so", flags={"sse4_2", "popcnt", "ssse3", "avx", "avx2", "fma"})
        with caplog.at_level(logging.WARNING, logger="argosy.engine.cpu_kernels"):
            assert not cpu_kernels.available()
        assert "built for x86-64-v4; this CPU lacks avx512" in caplog.text
    finally:
        monkeypatch.undo()
        cpu_kernels._library.cache_clear()


def test_an_unknown_target_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown target"):
        cpu_kernels.build_for_target(tmp_path, "native-ish")


def test_a_prebuilt_library_missing_a_kernel_keeps_pytorch(monkeypatch, tmp_path, caplog):
    """A library lacking a kernel this release calls (here: built without small_ops.c) is refused with a
    warning at load, not an AttributeError when the engine starts."""
    import subprocess

    old = tmp_path / "old.so"
    sources = [str(s) for s in cpu_kernels.SOURCES if s.name != "small_ops.c"]
    flags = [f for f in cpu_kernels.FLAGS if f != "-march=native"]
    subprocess.run(["cc", *flags, *sources, "-o", str(old)], check=True, timeout=300)
    old.with_suffix(".target").write_text("x86-64\n")
    try:
        load(monkeypatch, old)
        with caplog.at_level(logging.WARNING, logger="argosy.engine.cpu_kernels"):
            assert not cpu_kernels.available()
        assert "CPU kernels unavailable" in caplog.text and "rms_norm_f32" in caplog.text
    finally:
        monkeypatch.undo()
        cpu_kernels._library.cache_clear()
