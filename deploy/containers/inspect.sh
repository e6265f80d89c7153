#!/usr/bin/env bash
# What an Argosy image holds, without running Argosy (no GPU needed, even for the CUDA image):
#   deploy/containers/inspect.sh localhost/argosy-cuda:latest
# Prints its size, its layers (size and the step that made each), user, labels, health check, and, from
# a Python started in it, torch's version and CUDA, the CUDA wheels, and whether a compiler or pip is there.
set -euo pipefail
IMAGE="${1:-localhost/argosy-cpu:latest}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}"
podman image inspect "$IMAGE" --format 'image {{.RepoTags}}: {{.Size}} bytes, user {{.Config.User}}, stop signal {{.Config.StopSignal}}'
podman image inspect "$IMAGE" --format '{{range $k, $v := .Config.Labels}}label {{$k}}={{$v}}{{"\n"}}{{end}}'
podman image inspect "$IMAGE" --format 'healthcheck {{.HealthCheck.Test}} every {{.HealthCheck.Interval}}'
echo "layers (oldest first; empty ones left out):"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | awk -F'\t' '$1 != "0B" && $1 != "0 B"' | tac | cut -c1-140
podman run --rm --network=none --no-healthcheck --entrypoint /opt/argosy/bin/python "$IMAGE" -c '
import importlib.metadata as m, shutil, torch
cuda = sorted(d.metadata["Name"] for d in m.distributions() if d.metadata["Name"].lower().startswith(("nvidia", "cuda", "triton")))
print("torch", torch.__version__, "CUDA", torch.version.cuda, "| GPU visible:", torch.cuda.is_available())
print(len(cuda), "CUDA wheels:", ", ".join(cuda) or "none")
print("compiler:", shutil.which("cc") or shutil.which("gcc") or "none", "| pip:", shutil.which("pip") or "none")'
