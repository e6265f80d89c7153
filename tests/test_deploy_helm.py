"""deploy/helm/argosy: `helm lint` clean, `helm template` for several value sets, every rendered object
valid against the Kubernetes schemas (kubernetes-validate, offline), the fleet files it renders valid
fleet files, and the values schema refusing bad values."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from argosy.config import parse_fleet
from tests.fleet_fixtures import ROOT
from tests.helm_tool import helm_binary

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra brings kubernetes-validate")

CHART = ROOT / "deploy" / "helm" / "argosy"
K8S_VERSIONS = ("1.27.0", "1.37.0")  # the oldest the chart supports (kubeVersion) and the newest schemas
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule")}
KEY = {"name": "ops", "hash": "sha256:" + "ab" * 32}

VALUE_SETS = {
    "defaults": {},
    "production": {
        "image": {"repository": "registry.example/argosy-cuda", "tag": "0.1.0", "pullPolicy": "Always"},
        "imagePullSecrets": ["regcred"],
        "fleet": {"keys": [KEY], "gateway": {"max_retries": 1},
                  "providers": {"kubernetes": {"scheduler_name": "argosy-scheduler", "gpu_resource": "nvidia.com/gpu",
                                               "volumes": [{"name": "models",
                                                            "persistentVolumeClaim": {"claimName": "models"}}],
                                               "volume_mounts": [{"name": "models", "mountPath": "/models"}]}},
                  "models": [{"name": "Llama-3.1-8B-Instruct", "checkpoint": "/models/llama-3.1-8b",
                              "engine": {"kv_cache_memory_gib": 20, "dtype": "bfloat16"},
                              "autoscaling": {"min_replicas": 3, "max_replicas": 12, "metric": "kv_cache",
                                              "target": 0.7}},
                             {"name": "qwen", "checkpoint": "/models/qwen", "autoscaling": {"min_replicas": 1}},
                             {"name": "external", "upstreams": ["http://vllm.other.svc:8000"]}]},
        "gateway": {"replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 20}},
        "controller": {"replicas": 2},
        "redis": {"enabled": False, "url": "rediss://redis.cache.svc:6380/0"},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                    "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        "scheduler": {"enabled": True},
    },
    "minimal": {
        "gateway": {"insecure": True, "replicas": 1, "pdb": {"minAvailable": 0}},
        "redis": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "metrics": {"grafanaDashboard": {"enabled": False}},
        "replicas": {"headlessServices": False, "pdb": {"enabled": False}},
        "serviceAccount": {"create": False, "name": "existing"},
    },
}


@pytest.fixture(scope="module")
def helm():
    return helm_binary()


def run_helm(helm: str, *args: str, values: dict | None = None, tmp_path=None) -> subprocess.CompletedProcess:
    cmd = [helm, *args]
    if values:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def render(helm: str, values: dict, tmp_path) -> list[dict]:
    out = run_helm(helm, "template", "prod", str(CHART), "--namespace", "argosy", values=values, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_lint_is_clean_and_every_object_is_valid(helm, tmp_path, name):
    lint = run_helm(helm, "lint", "--strict", str(CHART), values=VALUE_SETS[name], tmp_path=tmp_path)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr
    docs = render(helm, VALUE_SETS[name], tmp_path)
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert {("apps/v1", "Deployment"), ("v1", "Secret"), ("policy/v1", "PodDisruptionBudget")} <= kinds
    assert not any(d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-replicas") for d in docs)
    for d in docs:
        if (d["apiVersion"], d["kind"]) in CRDS:  # no schema offline: the fields the Operator requires
            assert d["metadata"]["name"] and isinstance(d["spec"], dict), d
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(d, version, strict=True)
        assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]


def test_the_validator_rejects_what_the_api_server_would(tmp_path):
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_values_become_the_fleet_file(helm, tmp_path):
    docs = render(helm, VALUE_SETS["production"], tmp_path)
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-fleet"))
    controller = parse_fleet(yaml.safe_load(secret["stringData"]["controller.yaml"]), "controller.yaml")
    gateway = parse_fleet(yaml.safe_load(secret["stringData"]["gateway.yaml"]), "gateway.yaml")
    k8s = controller.providers["kubernetes"]
    assert k8s["leader_election"] is True and k8s["namespace"] == "argosy"  # two controllers: a Lease
    assert k8s["image"] == "registry.example/argosy-cuda:0.1.0" and k8s["scheduler_name"] == "argosy-scheduler"
    assert k8s["labels"]["app.kubernetes.io/instance"] == "prod"
    assert controller.gateway.redis_url == "rediss://redis.cache.svc:6380/0" == gateway.gateway.redis_url
    assert [k.name for k in controller.keys] == ["ops"] and controller.gateway.max_retries == 1
    llama = next(m for m in controller.models if m.name == "Llama-3.1-8B-Instruct")
    assert llama.provider == "kubernetes" and llama.engine.kv_cache_memory_gib == 20 and llama.discover is None
    by_name = {m.name: m for m in gateway.models}
    assert by_name["Llama-3.1-8B-Instruct"].discover == "prod-argosy-replicas-llama-3-1-8b-instruct.argosy.svc:8000"
    assert by_name["external"].discover is None and by_name["external"].upstreams == ["http://vllm.other.svc:8000"]
    # The headless Service selects the labels the provider puts on that model's pods.
    from argosy.config_providers import KubernetesProviderOptions
    from argosy.fleet.kubernetes_pods import replica_pod

    pod = replica_pod("p", "r1", "Llama-3.1-8B-Instruct", "/models/l", [], {}, None,
                      KubernetesProviderOptions.model_validate(k8s), "c", None)
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].startswith("prod-argosy-replicas-l"))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    pdbs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodDisruptionBudget"}
    pdb = pdbs[svc["metadata"]["name"]]
    assert pdb["spec"]["minAvailable"] == 2  # min_replicas 3 - 1
    gw = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "prod-argosy-gateway")
    assert "replicas" not in gw["spec"]  # the HPA owns it
    assert "--insecure" not in gw["spec"]["template"]["spec"]["containers"][0]["args"]
    # The controller sizes each model from its checkpoint's config.json: it mounts the replicas' volumes.
    ctl = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "prod-argosy-controller")
    pod = ctl["spec"]["template"]["spec"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_only_the_gateways_and_the_controller_reach_the_replicas(helm, tmp_path):
    docs = render(helm, VALUE_SETS["defaults"], tmp_path)
    pol = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-replicas"))
    assert pol["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "replica"
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    peers = [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in pol["spec"]["ingress"][0]["from"]]
    assert peers == ["gateway", "controller"]


def test_dashboard_and_alerts_are_the_deploy_folder_s(helm, tmp_path):
    dashboard, alerts = ROOT / "deploy" / "grafana" / "argosy.json", ROOT / "deploy" / "prometheus" / "alerts.yml"
    assert (CHART / "files" / "argosy.json").read_bytes() == dashboard.read_bytes()
    assert (CHART / "files" / "alerts.yml").read_bytes() == alerts.read_bytes()
    docs = render(helm, VALUE_SETS["production"], tmp_path)
    dash = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert json.loads(dash["data"]["argosy.json"]) == json.loads(dashboard.read_text())
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(alerts.read_text())["groups"]


@pytest.mark.parametrize("bad", [{"gateway": {"replicas": "two"}}, {"redis": {"url": "http://redis:6379"}},
                                 {"gateway": {"replica": 2}}, {"image": {"pullPolicy": "Sometimes"}}])
def test_the_values_schema_refuses_bad_values(helm, tmp_path, bad):
    out = run_helm(helm, "template", "x", str(CHART), values=bad, tmp_path=tmp_path)
    assert out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr, out.stderr
