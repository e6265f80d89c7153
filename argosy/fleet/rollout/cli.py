"""`argosy rollout`: start, follow and steer rollouts of a running `argosy serve` (its admin API).

    argosy rollout start MODEL --to REVISION [--strategy canary|blue-green|rolling] [--wait]
    argosy rollout status [MODEL] [--watch]
    argosy rollout promote MODEL [--full] | pause MODEL | resume MODEL | abort MODEL [--reason TEXT]
    argosy rollout shadow [MODEL]          shadow agreement by model, candidate and prompt length
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from typing import Any

import httpx

from argosy.config_rollout import STRATEGIES


def add_rollout_arguments(p: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help="the gateway of a running `argosy serve` (default: the newest on this machine, else http://127.0.0.1:8000)")
    common.add_argument("--admin-key", default=os.environ.get("ARGOSY_ADMIN_KEY"),
                        help="admin key, when the fleet has keys (default: $ARGOSY_ADMIN_KEY, or the local admin "
                        "credential of the `argosy serve` at --url on this machine)")
    common.add_argument("--json", action="store_true", help="print the raw JSON")
    sub = p.add_subparsers(dest="rollout_command", required=True)
    s = sub.add_parser("start", parents=[common], help="roll MODEL out to a revision of the fleet file")
    s.add_argument("model")
    s.add_argument("--to", required=True, metavar="REVISION", help="a revision in the model's `revisions`")
    s.add_argument("--strategy", choices=STRATEGIES, help="default: the model's rollout.strategy (canary)")
    s.add_argument("--wait", action="store_true", help="follow it to the end; exit 0 if it succeeded, else 1")
    st = sub.add_parser("status", parents=[common], help="stable revision, split and rollout of each model")
    st.add_argument("model", nargs="?")
    st.add_argument("--watch", action="store_true", help="print it again every 2 s until the rollout ends")
    pr = sub.add_parser("promote", parents=[common], help="skip the current pause (blue-green: switch now)")
    pr.add_argument("model")
    pr.add_argument("--full", action="store_true", help="canary: go to 100%% now, skipping the steps left")
    for verb, text in (("pause", "hold the rollout where it is (analysis and aborts go on)"),
                       ("resume", "go on after a pause")):
        sub.add_parser(verb, parents=[common], help=text).add_argument("model")
    ab = sub.add_parser("abort", parents=[common], help="candidate weight to 0 at once, its replicas drain "
                        "(blue-green after the switch: straight back to the old revision)")
    ab.add_argument("model")
    ab.add_argument("--reason", default="aborted by an operator")
    sh = sub.add_parser("shadow", parents=[common], help="shadow agreement report")
    sh.add_argument("model", nargs="?")


class AdminError(Exception):
    pass


def admin_key(args: argparse.Namespace) -> str | None:
    """--admin-key or $ARGOSY_ADMIN_KEY, else the local admin credential of the `argosy serve` at --url on
    this machine (as `argosy status` and `argosy keys`): a fleet with user keys and no admin key set has
    no other admin credential."""
    from argosy.gateway import local_admin

    return args.admin_key or local_admin.key_for(args.url)


def call(args: argparse.Namespace, method: str, path: str, body: dict | None = None) -> Any:
    key = admin_key(args)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise AdminError(f"cannot reach {args.url}: {e}") from None
    if r.status_code != 200:
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text[:300]
        raise AdminError(f"{args.url} answered {r.status_code}: {msg}")
    return r.json()


def run_rollout(args: argparse.Namespace) -> int:
    from argosy.gateway import local_admin

    args.url = args.url or local_admin.default_url()
    try:
        return _run(args)
    except AdminError as e:
        print(f"argosy rollout {args.rollout_command}: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    cmd = args.rollout_command
    if cmd == "shadow":
        out = call(args, "GET", "/admin/shadow" + (f"/{args.model}" if args.model else ""))
        print(json.dumps(out, indent=2) if args.json else render_shadow(out["models"]))
        return 0
    if cmd == "status":
        return watch(args, args.model) if args.watch else show(args, args.model)
    body: dict[str, Any] = {}
    if cmd == "start":
        body = {"to": args.to, **({"strategy": args.strategy} if args.strategy else {})}
    elif cmd == "promote":
        body = {"full": args.full}
    elif cmd == "abort":
        body = {"reason": args.reason}
    out = call(args, "POST", f"/admin/rollouts/{args.model}/{cmd}", body)
    print(json.dumps(out, indent=2) if args.json else render(out))
    if cmd == "start" and args.wait:
        return watch(args, args.model)
    return 0


def show(args: argparse.Namespace, model: str | None) -> int:
    out = call(args, "GET", "/admin/rollouts" + (f"/{model}" if model else ""))
    models = [out] if model else out["models"]
    print(json.dumps(out, indent=2) if args.json else "\n\n".join(render(m) for m in models) or "no managed models")
    return 0


def watch(args: argparse.Namespace, model: str | None) -> int:
    """Print the status every 2 s until no rollout runs; 0 when each one followed succeeded."""
    while True:
        out = call(args, "GET", "/admin/rollouts" + (f"/{model}" if model else ""))
        models = [out] if model else out["models"]
        print(time.strftime("%H:%M:%S"), "\n".join(render(m, events=3) for m in models), flush=True)
        running = [m for m in models if m["rollout"] and m["rollout"]["phase"] not in
                   ("succeeded", "aborted", "switched_back")]
        if not running:
            return 0 if all(not m["rollout"] or m["rollout"]["phase"] == "succeeded" for m in models) else 1
        time.sleep(2)


def _t(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "-"


def render(m: dict, events: int = 8) -> str:
    split = ", ".join(f"{rev} {w:g}%" for rev, w in m["split"].items())
    out = [f"model {m['model']}: stable {m['stable']}; split {split}"]
    r = m.get("rollout")
    if r:
        where = f"step {r['step'] + 1} at {r['weight']:g}%" if r["strategy"] == "canary" else \
            f"{r['replaced']}/{r['size']} replaced" if r["strategy"] == "rolling" else f"weight {r['weight']:g}%"
        out.append(f"  rollout {r['id']}: {r['strategy']} {r['from_revision']} -> {r['to_revision']}, "
                   f"{r['phase']}{' (paused)' if r['paused'] else ''}, {where}; started {_t(r['started_at'])}"
                   + (f", ended {_t(r['finished_at'])}" if r["finished_at"] else ""))
        a = r["analyses"]
        out.append(f"  analyses: {a.get('pass', 0)} passed, {a.get('fail', 0)} failed, "
                   f"{a.get('inconclusive', 0)} inconclusive")
        if r.get("reason"):
            out.append(f"  reason: {r['reason']}")
        for e in r["events"][-events:]:
            extra = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "at", "to"))
            out.append(f"    {e['at']} {e['event'].removeprefix('rollout_')}" + (f": {extra}" if extra else ""))
    for h in m.get("history", [])[-3:] if not r else []:
        out.append(f"  earlier: {h['strategy']} -> {h['to_revision']}: {h['phase']} ({h.get('reason')})")
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render_shadow(models: dict) -> str:
    if not models:
        return "no shadow pairs recorded"
    out = [f"{'model':<16} {'candidate':<10} {'prompt tokens':<13} {'pairs':>6} {'greedy':>6} {'identical':>9} "
           f"{'first diff':>10} {'len ratio':>9} {'finish =':>8} {'lp div':>7} {'judge':>6}"]
    for model, revs in models.items():
        for rev, s in revs.items():
            rows = [("all", s), *s["by_prompt_tokens"].items()]
            for bucket, x in rows:
                out.append(f"{model:<16} {rev:<10} {bucket:<13} {x['pairs']:>6} {x['greedy_pairs']:>6} "
                           f"{_pct(x['identical_greedy']):>9} {x['mean_first_diff_token'] or '-':>10} "
                           f"{x['mean_length_ratio'] or '-':>9} {_pct(x['same_finish_reason']):>8} "
                           f"{x['mean_logprob_divergence'] or '-':>7} {_pct(x['judge_mean']):>6}")
    out.append("identical: share of greedy pairs (temperature 0) whose outputs were the same; first diff: mean "
               "token index where differing outputs part; lp div: mean |logprob difference| of the chosen tokens")
    return "\n".join(out)
