"""Schemathesis against an OpenAPI document, each case counted from its HAR report (bench and CI).

`run_schemathesis` runs the `schemathesis` command (positive and negative cases, the coverage and
fuzzing phases, check: not a server error) and returns every request it made, by operation and by
status, with the responses >= 500 kept for the report. The same seed and document give the same cases,
so two targets (Argosy's gateway, LiteLLM's proxy) can be compared case for case.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FuzzRun:
    target: str
    by_operation: Counter = field(default_factory=Counter)
    by_status: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    exit_code: int = 0
    output: str = ""

    @property
    def cases(self) -> int:
        return sum(self.by_status.values())

    @property
    def errors_5xx(self) -> int:
        return sum(n for s, n in self.by_status.items() if s >= 500)


def schemathesis_command() -> list[str]:
    exe = Path(sys.executable).parent / "schemathesis"
    return [str(exe)] if exe.exists() else [shutil.which("schemathesis") or "schemathesis"]


def _operation(method: str, path: str, templates: list[str]) -> str:
    for t in templates:
        if re.fullmatch(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(t)), path):
            return f"{method} {t}"
    return f"{method} {path}"


def run_schemathesis(schema: str, base_url: str, har: Path, *, headers: dict[str, str] | None = None,
                     max_examples: int = 10, seed: int = 1, include_path_regex: str | None = None,
                     exclude_path_regex: str | None = None, templates: list[str] | None = None,
                     request_timeout: float = 60.0, phases: str = "coverage,fuzzing", target: str = "") -> FuzzRun:
    cmd = [*schemathesis_command(), "run", schema, "--url", base_url, "--checks", "not_a_server_error",
           "-n", str(max_examples), "--seed", str(seed), "--phases", phases, "--mode", "all", "-w", "1",
           "--request-timeout", str(request_timeout), "--report", "har", "--report-har-path", str(har),
           "--continue-on-failure", "--suppress-health-check", "all", "--warnings", "off", "--no-shrink"]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    if include_path_regex:
        cmd += ["--include-path-regex", include_path_regex]
    if exclude_path_regex:
        cmd += ["--exclude-path-regex", exclude_path_regex]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    run = FuzzRun(target or base_url, exit_code=proc.returncode, output=proc.stdout[-4000:] + proc.stderr[-2000:])
    if not har.exists():
        raise RuntimeError(f"schemathesis wrote no report ({proc.returncode}):\n{run.output}")
    for e in json.loads(har.read_text())["log"]["entries"]:
        method, url, status = e["request"]["method"], e["request"]["url"], e["response"]["status"]
        path = "/" + url.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0] if "/" in url.split("://", 1)[1] else "/"
        run.by_operation[_operation(method, path, templates or [])] += 1
        run.by_status[status] += 1
        if status >= 500:
            body = (e["response"].get("content") or {}).get("text", "")[:300]
            sent = (e["request"].get("postData") or {}).get("text", "")[:300]
            run.server_errors.append(f"{status} {method} {path} <- {sent!r} -> {body!r}")
    return run
