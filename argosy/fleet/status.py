"""`argosy status` (a running `argosy serve`: models, replicas, load, decisions) and `argosy config check`."""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from argosy.config import FleetConfigError, load_fleet


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="the gateway of a running `argosy serve` (default: the newest on this machine, else http://127.0.0.1:8000)")
    p.add_argument("--admin-key", default=None, help="admin key, when the fleet has keys")
    p.add_argument("--json", action="store_true", help="print the raw JSON")


def run_status(args: argparse.Namespace) -> int:
    from argosy.gateway import local_admin

    args.url = args.url or local_admin.default_url()
    key = args.admin_key or local_admin.key_for(args.url)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(args.url.rstrip("/") + "/admin/fleet", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        print(f"argosy status: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        print(f"argosy status: {args.url} answered {r.status_code}: {r.text[:300]}", file=sys.stderr)
        return 1
    st = r.json()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(render(st))
    return 0


def render(st: dict) -> str:
    out = []
    for n in st["nodes"]:
        gpus = ", ".join(f"{g['model']} {g['used_gib']:.1f}/{g['memory_gib']:.0f} GiB" for g in n["gpus"]) or "no GPU"
        total = f"/{n['memory_gib']:.1f}" if n["memory_gib"] else ""
        ram = f"{n['used_gib']:.2f}{total} GiB RAM"
        res = ", ".join(f"{k} {r['used']:g}/{r['total']:g}" for k, r in (n.get("resources") or {}).items()
                        if not k.startswith("node:"))
        kind = f", {n['capacity_kind']}" if n.get("capacity_kind") else ""
        gone = " PREEMPTED (cordoned)" if n.get("preempted") else ""
        out.append(f"node {n['name']} ({n['provider']}{kind}): {gpus}; {ram}" + (f"; resources {res}" if res else "")
                   + gone)
    for m in st["models"]:
        ready = sum(1 for r in m["replicas"] if r["state"] == "ready" and not r["pooled"])
        out.append(f"\nmodel {m['model']} ({m['provider']}): {ready} ready, desired {m['desired']}, "
                   f"panic {'yes' if m['panic'] else 'no'}; {m['in_flight']} in flight, {m['queued']} queued, "
                   f"{m['held']} held for a cold start")
        if m["unplaceable"]:
            out.append(f"  cannot place a replica: {m['unplaceable']}")
        running = {r.get("revision") for r in m["replicas"]}  # a revision drained and stopped is no part of it:
        revs = {rev: x for rev, x in (m.get("revisions") or {}).items() if x["weight"] > 0 or rev in running}
        if len(revs) > 1 or m.get("rollout"):  # after a blue-green the split had still said "v1 0%"
            split = ", ".join(f"{rev} {x['weight']:g}%" for rev, x in revs.items())
            ro = m.get("rollout")
            now = f"; rollout to {ro['to_revision']} ({ro['strategy']}): {ro['phase']}" if ro else ""
            out.append(f"  stable {m.get('stable')}; split {split}{now} (argosy rollout status {m['model']})")
        kinds = "capacity" in st
        out.append(f"  {'replica':<8} {'revision':<9} {'state':<9} {'pool':<5} {'node':<10} {'in flight':>9} "
                   f"{'age s':>7} {'cold start s':>12}"
                   + (f"  {'region':<10} {'provider':<10} {'kind':<9} {'$/h':>8}" if kinds else "") + "  url")
        for r in m["replicas"]:
            cs = "" if r["cold_start_s"] is None else f"{r['cold_start_s']:.1f}"
            pool = "yes" if r["pooled"] else "no"
            where = ""
            if kinds:
                usd = "-" if r.get("usd_per_hour") is None else f"{r['usd_per_hour']:.2f}"
                where = (f"  {r.get('region') or '-':<10} {r.get('provider') or '-':<10} "
                         f"{r.get('capacity_kind') or '-':<9} {usd:>8}")
            out.append(f"  {r['id']:<8} {r.get('revision') or '-':<9} {r['state']:<9} {pool:<5} {r['node'] or '-':<10} "
                       f"{r['in_flight']:>9} {r['age_s']:>7.1f} {cs:>12}{where}  {r['url'] or '-'}")
        for d in m["decisions"]:
            out.append(f"  decision at {d['at']}: {d['direction']} {d['actual']} -> {d['desired']} ({d['reason']})")
        for f in m["recent_failures"]:
            out.append(f"  failed {f['id']} at {f['url']}: {f['detail']}")
    cap = st.get("capacity")
    if cap:
        out.append("\nreplicas by region, provider and capacity kind:")
        for g in cap["groups"]:
            out.append(f"  {g['region'] or '-':<10} {g['provider'] or '-':<10} {g['capacity_kind'] or '-':<9} "
                       f"{g['replicas']:>3} replicas  ${g['usd_per_hour']:.2f}/h")
        out.append(f"  total ${cap['usd_per_hour']:.2f}/h (${cap['usd_per_hour'] * 730:,.0f}/month at 730 h)")
        for p in cap["preemptions"]:
            out.append(f"  preemption notice at {p['at']} ({p['source']}): node {p['node']}, {p['deadline_s']:g} s; "
                       f"draining {', '.join(d['replica'] for d in p['draining']) or 'nothing'}")
    return "\n".join(out)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_command", required=True)
    c = sub.add_parser("check", help="validate a fleet file; every error names its field")
    c.add_argument("file")


def run_config(args: argparse.Namespace) -> int:
    from argosy.fleet.controller import PROVIDERS, known_nodes, managed, model_need, routed_only
    from argosy.fleet.placement import Placer, Unplaceable
    from argosy.fleet.serve import config_problem
    from argosy.gateway.keys import KeyStore
    from argosy.gateway.pepper import PepperError

    try:
        fleet = load_fleet(args.file)
    except FleetConfigError as e:
        print(f"argosy config check: {e}", file=sys.stderr)
        return 2
    problems, notes = [], routed_only(fleet)
    if not fleet.models:  # what `argosy serve --config` does with it (fleet_from_args)
        from argosy.engine.model_names import default_model

        notes.append(f"no models listed: `argosy serve --config {args.file}` serves the default model "
                     f"({default_model()[1]}) on one replica; `argosy gateway` routes nothing")
    try:  # what `argosy serve` and `argosy gateway` refuse to start with
        KeyStore.from_fleet(fleet)
    except (PepperError, ValueError) as e:
        problems.append(f"keys: {e}")
    models = managed(fleet)
    providers = list(dict.fromkeys(m.provider for m in models))
    for name in providers:
        if name not in PROVIDERS:
            problems.append(f"providers.{name}: unknown provider ({', '.join(PROVIDERS)})")
    nodes, later = known_nodes(fleet, [p for p in providers if p in PROVIDERS])
    placer = Placer(nodes)
    for m in models:
        try:
            need = model_need(m, nodes)
        except (OSError, KeyError, ValueError) as e:
            problems.append(f"models.{m.name}.checkpoint: cannot read the checkpoint {m.checkpoint} ({e})")
            continue
        problem = config_problem(m.checkpoint, m.kind, m.engine.tensor_parallel_size)
        if problem:  # what `argosy serve` would refuse to start with
            problems.append(f"models.{m.name}: {problem}")
            continue
        if m.provider not in PROVIDERS:
            continue
        if m.provider in later:
            notes.append(f"models.{m.name}: placement not checked: provider {m.provider!r} discovers its nodes "
                         f"at run time (list nodes with provider: {m.provider} to check it)")
            continue
        for i in range(max(m.autoscaling.min_replicas, 1)):
            try:
                if m.pipeline_across_nodes:  # each stage on a node of its own
                    placer.place_stages(f"{m.name}-{i}", m.name, need, m.engine.pipeline_parallel_size, m.provider)
                else:
                    placer.place(f"{m.name}-{i}", m.name, need, m.provider)
            except Unplaceable as e:
                problems.append(f"models.{m.name}: replica {i + 1} of min_replicas cannot be placed: {e}")
    if problems:
        print(f"argosy config check: {args.file}:\n" + "\n".join(f"  {p}" for p in problems), file=sys.stderr)
        return 2
    print(f"{args.file}: ok ({len(fleet.models)} models, {len(models)} managed, {len(nodes)} nodes)")
    for n in notes:
        print(f"  {n}")
    return 0
