"""A kube-scheduler extender that places Argosy replicas by GPU memory, with the fleet's own Placer.

Kubernetes counts whole GPUs; it cannot tell that an 80 GiB GPU holds two 30 GiB models, or that a
"free" GPU has 20 GiB left. kube-scheduler calls this over HTTP (KubeSchedulerConfiguration
`extenders:`, docs/kubernetes.md) with its own JSON shapes:

    POST /filter      ExtenderArgs {"pod", "nodes": NodeList | "nodenames"} -> ExtenderFilterResult
                      {"nodes" | "nodenames", "failedNodes": {node: why}, "error"}
    POST /prioritize  ExtenderArgs -> HostPriorityList [{"host", "score"}], scores 0..10
    POST /bind        ExtenderBindingArgs {"podName", "podNamespace", "podUID", "node"} -> {"error"}

A pod is Argosy's when it has the `argosy.dev/need-gpus` annotation (KubernetesProvider writes it,
with `need-gib` per GPU, "whole" for entire GPUs, and `model`); any other pod passes every node. The
GPUs of a node come from its Node object (nvidia.com/gpu allocatable, the gpu.memory label in MiB);
what Argosy placed comes from its bindings (and, with an API client, from the bound replica pods,
re-read every `sync_s`). Filter: the nodes where the Placer finds room. Prioritize: the Placer's own
preference: a node without this model first (spread, for redundancy), then one where no GPU already
holds it, then best fit (least memory left over); 10 for the best, 0 for the worst. Bind: the GPUs are
chosen, written to the pod's `argosy.dev/gpus` annotation (the container reads CUDA_VISIBLE_DEVICES
from it) and the pod is bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from argosy.bind_errors import port_number, port_problem
from argosy.config_providers import KubernetesProviderOptions
from argosy.fleet.kubernetes_pods import LABEL, node_from_k8s
from argosy.fleet.placement import Need, Node, Placement, Placer, Unplaceable

log = logging.getLogger("argosy.fleet")
MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority


def pod_need(pod: dict) -> tuple[str, Need] | None:
    """(model, need) of an Argosy replica pod, from its annotations; None for any other pod."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if f"{LABEL}/need-gpus" not in ann:
        return None
    gib = ann.get(f"{LABEL}/need-gib", "whole")
    need = Need(int(ann[f"{LABEL}/need-gpus"]), float("inf") if gib == "whole" else float(gib))
    return ann.get(f"{LABEL}/model", pod["metadata"].get("name", "?")), need


class Extender:
    """The extender's state: nodes seen, placements bound, pods seen at filter (for bind)."""

    def __init__(self, opts: KubernetesProviderOptions | None = None, core_api=None):
        self.opts = opts or KubernetesProviderOptions()
        self.core = core_api
        self.nodes: dict[str, Node] = {}
        self.bound: dict[str, tuple[str, Placement]] = {}  # pod uid -> (model, placement)
        self.pending: dict[str, tuple[str, Need, dict]] = {}  # pod uid -> (model, need, pod) from filter

    def _learn_nodes(self, args: dict) -> list[str]:
        items = (args.get("nodes") or {}).get("items") or []
        for obj in items:
            node = node_from_k8s(obj, self.opts)
            self.nodes[node.name] = node
        return [o["metadata"]["name"] for o in items] if items else list(args.get("nodenames") or [])

    def placer(self) -> Placer:
        """A Placer over the known nodes with every bound replica counted."""
        fresh = [Node(n.name, n.provider, [type(g)(g.index, g.model, g.memory_gib) for g in n.gpus], n.memory_gib)
                 for n in self.nodes.values()]
        p = Placer(fresh)
        for uid, (model, placement) in self.bound.items():
            if placement.node in p.nodes:
                p.hold(uid, model, placement)
        return p

    def filter(self, args: dict) -> dict:
        names = self._learn_nodes(args)
        pod = args.get("pod") or {}
        found = pod_need(pod)
        by_name = "nodes" not in args or not args.get("nodes")
        if found is None:  # not ours: every node stays
            return {"nodenames": names} if by_name else {"nodes": args["nodes"], "failedNodes": {}}
        model, need = found
        self.pending[pod["metadata"].get("uid") or pod["metadata"]["name"]] = (model, need, pod)
        placer, fits, failed = self.placer(), [], {}
        for name in names:
            node = placer.nodes.get(name)
            if node is None:
                failed[name] = "argosy: node unknown to the extender"
            elif placer.fit(node, model, need) is None:
                try:
                    placer.place("probe", model, need, down=set(placer.nodes) - {name})
                except Unplaceable as e:
                    failed[name] = f"argosy: {e}"
            else:
                fits.append(name)
        if by_name:
            return {"nodenames": fits, "failedNodes": failed}
        keep = [o for o in args["nodes"]["items"] if o["metadata"]["name"] in fits]
        return {"nodes": {**args["nodes"], "items": keep}, "failedNodes": failed}

    def prioritize(self, args: dict) -> list[dict]:
        names = self._learn_nodes(args)
        found = pod_need(args.get("pod") or {})
        if found is None:
            return [{"host": n, "score": 0} for n in names]
        model, need = found
        placer = self.placer()
        keys = {}
        for name in names:
            fit = placer.fit(placer.nodes[name], model, need) if name in placer.nodes else None
            keys[name] = fit[0] if fit else None
        ranked = sorted({k for k in keys.values() if k is not None})
        scores = []
        for name in names:
            k = keys[name]
            if k is None:
                score = 0
            elif len(ranked) == 1:
                score = MAX_PRIORITY
            else:
                score = round(MAX_PRIORITY * (1 - ranked.index(k) / (len(ranked) - 1)))
            scores.append({"host": name, "score": score})
        return scores

    def bind(self, args: dict) -> dict:
        uid, node = args.get("podUID") or args.get("podName"), args.get("node")
        pending = self.pending.pop(uid, None) or self.pending.pop(args.get("podName"), None)
        if pending is None:
            return {"error": f"argosy: pod {args.get('podNamespace')}/{args.get('podName')} was not filtered here"}
        model, need, _pod = pending
        placer = self.placer()
        try:
            placement = placer.place(uid, model, need, down=set(placer.nodes) - {node})
        except Unplaceable as e:
            return {"error": f"argosy: {e}"}
        if self.core is not None:
            err = self._bind_in_api(args, placement)
            if err:
                return {"error": err}
        self.bound[uid] = (model, placement)
        log.info("argosy extender: %s/%s -> %s GPUs %s", args.get("podNamespace"), args.get("podName"), node,
                 list(placement.gpus))
        return {"error": ""}

    def _bind_in_api(self, args: dict, placement: Placement) -> str:
        name, ns = args["podName"], args["podNamespace"]
        try:
            if placement.gpus:
                self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {
                    f"{LABEL}/gpus": ",".join(map(str, placement.gpus)), f"{LABEL}/node": placement.node}}})
            body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": args.get("podUID")},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": placement.node}}
            self.core.create_namespaced_binding(ns, body, _preload_content=False)
        except Exception as e:  # the scheduler retries the pod
            return f"argosy: bind failed: {type(e).__name__}: {e}"[:300]
        return ""

    def release(self, uid: str) -> None:
        self.bound.pop(uid, None)

    def sync(self) -> None:
        """Bound replica pods as the API lists them: the truth after a restart, and deletions."""
        out = json.loads(self.core.list_pod_for_all_namespaces(
            label_selector="app.kubernetes.io/component=replica", _preload_content=False).data)
        bound = {}
        for pod in out.get("items", []):
            found, ann = pod_need(pod), pod["metadata"].get("annotations") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if found is None or not node or (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                continue
            gpus = tuple(int(g) for g in ann.get(f"{LABEL}/gpus", "").split(",") if g)
            bound[pod["metadata"].get("uid") or pod["metadata"]["name"]] = (found[0], Placement(node, gpus, found[1]))
        self.bound = bound


def make_app(ext: Extender):
    from aiohttp import web  # here, not at import: `argosy --help` need not load aiohttp

    def handler(fn):
        async def handle(request):
            try:
                args = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return web.json_response({"error": "argosy: the body is not JSON"}, status=400)
            try:
                return web.json_response(fn(args))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                return web.json_response({"error": f"argosy: bad request: {type(e).__name__}: {e}"}, status=400)
        return handle

    app = web.Application(client_max_size=64 * 1024 * 1024)  # a NodeList of thousands of nodes
    app.router.add_post("/filter", handler(ext.filter))
    app.router.add_post("/prioritize", handler(ext.prioritize))
    app.router.add_post("/bind", handler(ext.bind))

    async def healthz(_):
        return web.json_response({"nodes": len(ext.nodes), "bound": len(ext.bound)})

    app.router.add_get("/healthz", healthz)
    return app


async def serve(ext: Extender, host: str, port: int, sync_s: float = 10.0) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(ext))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"argosy scheduler-extender: listening on http://{host}:{port}", flush=True)
    while True:
        if ext.core is not None:
            try:
                await asyncio.to_thread(ext.sync)
            except Exception as e:
                log.warning("argosy extender: sync: %s", f"{type(e).__name__}: {e}"[:200])
        await asyncio.sleep(sync_s)


def add_extender_arguments(p) -> None:
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=port_number, default=8888)
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster); with --no-api, none is read")
    p.add_argument("--no-api", action="store_true",
                   help="no API server (a dry run): learn only from the requests; bind records, binds nothing")
    p.add_argument("--sync-s", type=float, default=10.0, help="re-read the bound replica pods this often")


def run_extender(args) -> int:
    opts = KubernetesProviderOptions(kubeconfig=args.kubeconfig)
    core = None
    if not args.no_api:
        from kubernetes import client
        from kubernetes.config import ConfigException

        from argosy.fleet.kubernetes_provider import make_api_client

        try:
            core = client.CoreV1Api(make_api_client(opts))
        except (ConfigException, OSError) as e:
            print(f"argosy scheduler-extender: no Kubernetes API to reach ({e}): pass --kubeconfig FILE, run it "
                  "in the cluster, or --no-api for a dry run", file=sys.stderr)
            return 2
    try:
        asyncio.run(serve(Extender(opts, core), args.host, args.port, args.sync_s))
    except KeyboardInterrupt:
        return 130
    except OSError as e:  # the listening socket
        print(f"argosy scheduler-extender: cannot listen on {args.host}:{args.port}: {port_problem(e, args.port)}",
              file=sys.stderr)
        return 2
    return 0
