"""scripts/check_import_cycles.py finds circles among a package's modules: at import time, and through
imports inside functions (reported as lazy), but not through `if TYPE_CHECKING:` blocks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fleet_fixtures import ROOT

SCRIPT = ROOT / "scripts" / "check_import_cycles.py"


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def check(pkg: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *flags, str(pkg)], capture_output=True, text=True)


def test_a_circle_at_import_time_fails_the_check(tmp_path):
    pkg = package(tmp_path, {"a.py": "from pkg.b import f\n", "b.py": "import pkg.c\n",
                             "c.py": "from pkg import a\n", "d.py": "import pkg.a\n"})
    r = check(pkg)
    assert r.returncode == 1
    assert "import circle: pkg.a -> pkg.b -> pkg.c -> pkg.a" in r.stdout
    assert "pkg.d" not in r.stdout  # it imports the circle, it is not part of it


def test_a_lazy_import_that_closes_a_circle_counts_unless_only_import_time_is_asked(tmp_path):
    pkg = package(tmp_path, {"app.py": "from . import admin\n",
                             "admin.py": "def handle():\n    from .app import respond\n"})
    r = check(pkg)
    assert r.returncode == 1 and "pkg.admin ~> pkg.app -> pkg.admin" in r.stdout
    assert check(pkg, "--import-time").returncode == 0


def test_lazy_imports_type_checking_blocks_and_one_way_imports_pass(tmp_path):
    pkg = package(tmp_path, {
        "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import High\n",
        "high.py": "import json\nfrom pkg.low import *\n\ndef later():\n    import pkg.sub.leaf\n",
        "sub/__init__.py": "", "sub/leaf.py": "from ..low import x\n"})
    r = check(pkg)
    assert r.returncode == 0, r.stdout
    assert "no import circles" in r.stdout
