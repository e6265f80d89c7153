"""The gateway, the fleet controller and observe import one way (issue 23): no circle among them, even
through imports inside functions, and observe imports nothing from the gateway or the fleet."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.gateway_fixtures import ROOT

CHECKER = ROOT / "scripts" / "check_import_cycles.py"


def test_no_import_circle_touches_the_gateway_the_fleet_or_observe():
    proc = subprocess.run([sys.executable, str(CHECKER), "--lazy", "argosy.gateway", "argosy.fleet", "argosy.observe"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_observe_reads_nothing_above_it():
    spec = importlib.util.spec_from_file_location("check_import_cycles", CHECKER)
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    graph = checker.import_graph(ROOT / "argosy", lazy=True)
    upward = {(m, t) for m, targets in graph.items() if m.startswith("argosy.observe") for t in targets
              if t.startswith(("argosy.gateway", "argosy.fleet"))}
    assert not upward
