"""scripts/check_import_cycles.py: no import cycles in the engine, and the checker finds planted ones."""

import subprocess
import sys
from pathlib import Path

from tests.server_fixtures import ROOT

CHECKER = ROOT / "scripts" / "check_import_cycles.py"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), *args], capture_output=True, text=True, timeout=60)


def test_the_engine_has_no_import_cycles_even_through_lazy_imports():
    for extra in ([], ["--lazy"]):
        proc = check(*extra, "argosy.engine")
        assert proc.returncode == 0, proc.stdout


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_the_checker_reports_module_level_cycles_and_leaves_lazy_ones_to_lazy(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from pkg.b import x\n",
        "b.py": "import pkg.c\nx = 1\n",
        "c.py": "from . import a\n",  # a -> b -> c -> a, the last one relative
        "d.py": "def f():\n    from pkg import e\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\nfrom pkg import d\n",
    })
    proc = check("--root", str(pkg))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == "import cycle: pkg.a -> pkg.b -> pkg.c -> pkg.a", proc.stdout
    assert "pkg.d" not in proc.stdout  # d imports e only inside a function
    lazy = check("--root", str(pkg), "--lazy")
    assert "import cycle: pkg.d -> pkg.e -> pkg.d" in lazy.stdout
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    assert "pkg.d" not in check("--root", str(pkg), "--lazy").stdout  # typing-only imports never run
