"""The fleet file's `providers:` options, one model per provider (docs/deploy.md, docs/kubernetes.md).

A leaf module (pydantic only): argosy/config.py checks each provider's options with it; the providers
(argosy/fleet) read their own model from here. Every default is written here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from argosy.config_section import ConfigSection


class LocalProviderOptions(ConfigSection):
    python: str | None = None  # interpreter for `argosy engine` children (default: this one)


class RayProviderOptions(ConfigSection):
    address: str | None = None  # an existing cluster (ray://host:10001 or host:6379); None: a local one
    namespace: str = "argosy"
    num_cpus: float = Field(1.0, ge=0)  # CPUs each replica actor requests


class KubernetesProviderOptions(ConfigSection):
    """providers.kubernetes: each replica a Pod (docs/deploy.md, docs/kubernetes.md)."""
    kubeconfig: str | None = None  # None: the in-cluster service account, else $KUBECONFIG / ~/.kube/config
    context: str | None = None  # a kubeconfig context (None: its current one)
    namespace: str | None = None  # None: the controller pod's own namespace (in-cluster), else "default"
    image: str = "localhost/argosy-cpu:latest"  # the replicas' image (deploy/containers)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = []
    service_account: str | None = None  # the replicas' (None: the namespace's default)
    gpu_resource: str = "nvidia.com/gpu"  # the device plugin's resource name
    gpu_memory_label: str = "nvidia.com/gpu.memory"  # node label: MiB per GPU (GPU feature discovery's)
    gpu_product_label: str = "nvidia.com/gpu.product"
    cpu: str = "1"  # CPU request of a replica (also its limit when cpu_limit is true)
    cpu_limit: bool = False
    scheduler_name: str | None = None  # a kube-scheduler profile with Argosy's extender: pods are not pinned
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    labels: dict[str, str] = {}  # extra labels on every replica pod (e.g. for NetworkPolicies)
    volumes: list[dict[str, Any]] = []  # Kubernetes volume objects, e.g. the PVC that holds checkpoints
    volume_mounts: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    owner_pod: str | None = None  # owner of every replica pod (None: $POD_NAME, the controller's own pod)
    port: int = Field(8000, ge=1, le=65535)  # the replicas' container port
    termination_grace_s: int = Field(90, ge=1)  # preStop drain + SIGTERM shutdown must fit in it
    drain_s: int = Field(60, ge=0)  # preStop: wait this long at most for in-flight requests to finish
    start_timeout_s: float = Field(900, gt=0)  # scheduling + image pull + load, before the replica counts failed
    leader_election: bool = False  # several controllers: only the Lease holder starts replicas
    lease_name: str = "argosy-fleet-controller"
    lease_duration_s: int = Field(15, ge=2)
    resync_s: float = Field(30, gt=0)  # full re-list of pods and nodes besides the watches


PROVIDER_OPTIONS: dict[str, type[ConfigSection]] = {"local": LocalProviderOptions, "ray": RayProviderOptions,
                                               "kubernetes": KubernetesProviderOptions}


def check_provider_options(name: str, opts: dict[str, Any]) -> None:
    """providers.NAME's options, validated by that provider's model (a provider not listed takes any)."""
    model = PROVIDER_OPTIONS.get(name)
    if model is None:
        return
    where = f"providers.{name}"
    try:
        model.model_validate(opts)
    except ValidationError as e:
        errs = "; ".join(f"{where}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(errs) from None
