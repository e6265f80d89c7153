#!/usr/bin/env bash
# Builds Argosy's container images with podman from a checkout, reaching no container registry:
#
#   deploy/containers/build.sh            the CPU image   (localhost/argosy-cpu:VERSION and :latest)
#   deploy/containers/build.sh cuda       the CUDA image  (localhost/argosy-cuda:VERSION; several GB of wheels)
#   deploy/containers/build.sh lock       re-pin requirements-cpu.txt from pyproject.toml (lock-cuda: the CUDA one)
#
# Needs (Debian): podman buildah mmdebstrap runc uidmap; python3.11 with pip; the package registries
# (Debian's for the bases, PyPI's for the wheels). Steps, each cached under $ARGOSY_IMAGE_CACHE
# (default ~/.cache/argosy/containers) and reused while its inputs are unchanged:
#   1. the bases: Debian bookworm root filesystems made with mmdebstrap and `podman import`ed
#      (runtime: Python 3.11, tini, libgomp; build: the same plus gcc and pip), tagged by their package list;
#   2. the wheels: `pip download` of the pinned requirements (podman build runs with --network=none);
#   3. Argosy's own wheel, from the tracked files of this checkout (setuptools from a kept environment);
#   4. podman build --network=none --format docker (HEALTHCHECK needs the docker format): for the CPU
#      image first the base + user + dependencies image, tagged by its inputs (made once per lock), then
#      Argosy and its kernels on top of it, so a new revision rebuilds two small layers.
# podman keeps the build stages as untagged images (its layer cache, mostly shared layers); remove them
# with `podman image prune` when the disk matters more than the next build's time.
# Settings: CPU_TARGET (x86-64-v3: AVX2 + FMA, any x86 server since about 2015; x86-64-v2 for older
# CPUs, x86-64-v4 for AVX-512), PYTHON (python3.11), TAG (the package version), CONTAINERS_CONF (this
# folder's containers.conf when unset: runc and ulimits a sandbox cannot raise).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WHAT="${1:-cpu}"
PYTHON="${PYTHON:-python3.11}"
CPU_TARGET="${CPU_TARGET:-x86-64-v3}"
SUITE=bookworm
CACHE="${ARGOSY_IMAGE_CACHE:-$HOME/.cache/argosy/containers}"
VERSION="${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)}"
REVISION="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
RUNTIME_PKGS="python3,libgomp1,tini,ca-certificates"
BUILD_PKGS="python3,python3-pip,python3-venv,gcc,libc6-dev,libgomp1"

say() { printf '[build.sh %5ss] %s\n' "$SECONDS" "$*"; }
die() { printf 'build.sh: %s\n' "$*" >&2; exit 1; }

for tool in podman mmdebstrap "$PYTHON"; do
  command -v "$tool" >/dev/null || die "$tool is not installed (Debian: apt-get install -y podman buildah mmdebstrap runc uidmap python3.11)"
done
mkdir -p "$CACHE"

# A base image from Debian packages, tagged by a hash of the suite and the package list.
base_image() {  # name packages
  local name="$1" pkgs="$2" key tag tar
  key="$(printf '%s %s' "$SUITE" "$pkgs" | sha256sum | cut -c1-12)"
  tag="localhost/argosy-base-$name:$SUITE-$key"
  if ! podman image exists "$tag"; then
    tar="$CACHE/base-$name-$key.tar"
    say "base $name: mmdebstrap $SUITE with $pkgs"
    # No docs, man pages or locales: they are a third of a minimal Debian and nobody reads them in a container.
    mmdebstrap --quiet --variant=minbase --include="$pkgs" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      "$SUITE" "$tar"
    podman import --quiet "$tar" "$tag" >/dev/null
    rm -f "$tar"
  fi
  podman tag "$tag" "localhost/argosy-base-$name:$SUITE"
  say "base $name: $tag"
}

# Argosy's wheel, built from the files git tracks (a clean checkout's content; nothing left in the tree).
app_wheel() {  # out_dir
  local src
  src="$(mktemp -d)"
  (cd "$ROOT" && git ls-files -z 2>/dev/null | xargs -0 tar -cf - 2>/dev/null || tar -cf - --exclude=.venv --exclude=.git .) \
    | tar -xf - -C "$src"
  rm -rf "$1" && mkdir -p "$1"
  # setuptools in a virtual environment kept in the cache: pip's build isolation would fetch it every time.
  if [ ! -x "$CACHE/wheel-env/bin/python" ]; then
    "$PYTHON" -m venv "$CACHE/wheel-env"
    "$CACHE/wheel-env/bin/python" -m pip install --quiet "setuptools>=68" wheel
  fi
  # A fixed timestamp (the commit's) makes the same sources the same wheel, so podman reuses the app layer.
  SOURCE_DATE_EPOCH="$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 315532800)" \
    "$CACHE/wheel-env/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$1" "$src"
  rm -rf "$src"
}

lock() {  # cpu|cuda: pins every runtime dependency (no extras); pip resolves without installing anything
  local report flavor="$1"
  report="$(mktemp)"
  if [ "$flavor" = cpu ]; then  # this machine's pip configuration: the CPU torch wheel
    "$PYTHON" -m pip install --quiet --dry-run --ignore-installed --report "$report" "$ROOT" >/dev/null
  else  # PyPI alone (--isolated ignores pip.conf): its torch is the CUDA build, with the nvidia-* wheels
    "$PYTHON" -m pip --isolated install --quiet --dry-run --ignore-installed --report "$report" "$ROOT" >/dev/null
  fi
  "$PYTHON" - "$report" "$HERE/requirements-$flavor.txt" "$flavor" <<'EOF'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
pins = sorted(f"{i['metadata']['name'].lower()}=={i['metadata']['version']}" for i in items
              if i["metadata"]["name"].lower() != "argosy")
cuda = [p for p in pins if p.startswith(("nvidia-", "triton==", "cuda-"))]
if sys.argv[3] == "cpu":
    assert not cuda, f"CUDA wheels in the CPU lock: {cuda}"
    head = "# The CPU image's dependencies, pinned (build.sh lock). No CUDA wheel may appear here.\n"
else:
    assert cuda, "no CUDA wheel in the CUDA lock: the index served a CPU torch"
    head = "# The CUDA image's dependencies, pinned from PyPI (build.sh lock-cuda).\n"
open(sys.argv[2], "w").write(head + "\n".join(pins) + "\n")
print(f"{len(pins)} pins, {len(cuda)} CUDA")
EOF
  rm -f "$report"
}

# pip download of a requirements file into a cached folder (only what is missing is fetched).
wheels() {  # requirements dir [pip options...]
  local req="$1" dir="$2"
  shift 2
  mkdir -p "$dir"
  local missing
  missing="$(missing_wheels "$req" "$dir")"
  say "wheels: $(grep -cv '^#' "$req") pinned in $(basename "$req"), $(printf '%s' "$missing" | grep -c .) to fetch"
  if [ -n "$missing" ]; then  # pip download asks the index even for a wheel it has: only for missing ones
    printf '%s\n' "$missing" > "$dir/.missing.txt"
    "$PYTHON" -m pip download --quiet --only-binary=:all: --no-deps --dest "$dir" -r "$dir/.missing.txt" "$@"
  fi
}

missing_wheels() {  # requirements dir: the pins with no matching wheel in dir
  "$PYTHON" - "$1" "$2" <<'EOF'
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
have = {norm(w.name.split("-")[0]) + "-" + w.name.split("-")[1] for w in Path(sys.argv[2]).glob("*.whl")}
for line in open(sys.argv[1]):
    if "==" in line and not line.startswith("#"):
        name, ver = line.strip().split("==")
        if f"{norm(name)}-{ver}" not in have:
            print(line.strip())
EOF
}

bases() {  # both at once: mmdebstrap spends its time waiting on downloads and dpkg, not on the CPU
  local runtime build
  base_image runtime "$RUNTIME_PKGS" & runtime=$!
  base_image build "$BUILD_PKGS" & build=$!
  wait "$runtime" || die "the runtime base failed"
  wait "$build" || die "the build base failed"
}

build_cpu() {
  local ctx="$CACHE/context-cpu" t0=$SECONDS
  bases
  wheels "$HERE/requirements-cpu.txt" "$CACHE/wheels-cpu"
  mkdir -p "$ctx"
  rm -rf "$ctx/wheels-cpu" && cp -al "$CACHE/wheels-cpu" "$ctx/wheels-cpu" 2>/dev/null || cp -a "$CACHE/wheels-cpu" "$ctx/wheels-cpu"
  # Only the pinned wheels go in: an older download left in the cache must not reach the image.
  "$PYTHON" - "$HERE/requirements-cpu.txt" "$ctx/wheels-cpu" <<'EOF'
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
pins = {norm(l.split("==")[0]) + "-" + l.split("==")[1].strip() for l in open(sys.argv[1]) if "==" in l}
for w in Path(sys.argv[2]).glob("*.whl"):
    name, ver = w.name.split("-")[:2]
    if f"{norm(name)}-{ver}" not in pins:
        w.unlink()
EOF
  cp "$HERE/requirements-cpu.txt" "$ctx/"
  rm -rf "$ctx/kernels-src" && mkdir -p "$ctx/kernels-src/csrc"
  cp "$ROOT/argosy/engine/cpu_kernels.py" "$ctx/kernels-src/" && cp "$ROOT"/argosy/engine/csrc/*.[ch] "$ctx/kernels-src/csrc/"
  app_wheel "$ctx/dist"
  # The base + user + dependencies image, tagged by what goes into it: built once per lock.
  local key deps
  key="$( { cat "$HERE/requirements-cpu.txt"; sed '/^# ---- the C kernels/,$d' "$HERE/Containerfile.cpu";
            podman image inspect --format '{{.Id}}' localhost/argosy-base-runtime:$SUITE localhost/argosy-base-build:$SUITE; } \
          | sha256sum | cut -c1-12)"
  deps="localhost/argosy-cpu-deps:$key"
  if ! podman image exists "$deps"; then
    say "podman build $deps (base, user, dependencies)"
    podman build --network=none --format docker --layers --target runtime-deps \
      -f "$HERE/Containerfile.cpu" -t "$deps" "$ctx"
  fi
  say "podman build argosy-cpu:$VERSION on $deps (kernels for $CPU_TARGET)"
  podman build --network=none --format docker --layers --build-arg DEPS_IMAGE="$deps" \
    --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg CPU_TARGET="$CPU_TARGET" \
    -f "$HERE/Containerfile.cpu" -t "localhost/argosy-cpu:$VERSION" -t localhost/argosy-cpu:latest "$ctx"
  say "argosy-cpu:$VERSION built in $((SECONDS - t0)) s; $(podman image inspect --format '{{.Size}}' localhost/argosy-cpu:latest | awk '{printf "%.0f MB", $1/1e6}')"
}

build_cuda() {
  local ctx="$CACHE/context-cuda" t0=$SECONDS
  bases
  wheels "$HERE/requirements-cuda.txt" "$CACHE/wheels-cuda" --isolated
  mkdir -p "$ctx"
  rm -rf "$ctx/wheels-cuda" && (cp -al "$CACHE/wheels-cuda" "$ctx/wheels-cuda" 2>/dev/null || cp -a "$CACHE/wheels-cuda" "$ctx/wheels-cuda")
  cp "$HERE/requirements-cuda.txt" "$ctx/"
  app_wheel "$ctx/dist"
  say "podman build argosy-cuda:$VERSION"
  podman build --network=none --format docker --layers \
    --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
    -f "$HERE/Containerfile.cuda" -t "localhost/argosy-cuda:$VERSION" -t localhost/argosy-cuda:latest "$ctx"
  say "argosy-cuda:$VERSION built in $((SECONDS - t0)) s"
}

case "$WHAT" in
  cpu) build_cpu ;;
  cuda) build_cuda ;;
  all) build_cpu; build_cuda ;;
  lock) lock cpu ;;
  lock-cuda) lock cuda ;;
  bases) bases ;;
  *) die "usage: build.sh [cpu|cuda|all|lock|lock-cuda|bases]" ;;
esac
