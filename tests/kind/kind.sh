#!/usr/bin/env bash
# The kind path (docs/design.md#real-parts), for hosts with a Docker engine: the Dockerfile image, a kind cluster, the
# Helm chart with loops on. tests/kind/test_kind.py drives it and runs the examples; `make kind` runs
# that. Usage:
#
#   tests/kind/kind.sh check     exit 0 when a Docker engine answers, else print why and exit 3
#   tests/kind/kind.sh images    exit 0 when kind's node image is here or can be pulled, else say why, exit 4
#   tests/kind/kind.sh up        build the image, create (or reuse) the cluster, load, helm install
#   tests/kind/kind.sh down      delete the cluster
#   tests/kind/kind.sh env       print KUBECONFIG=… for the cluster
#
# Tools: docker (an engine), kind (on PATH, or built once with `go install` into the cache, like the
# local control plane), helm and kubectl (on PATH, or the ones `agentrun dev tools` built).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CLUSTER="${AGENTRUN_KIND_CLUSTER:-agentrun-kind}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
# The node image kind v0.33.0 lists for Kubernetes 1.36 (our control plane's minor), by digest.
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed}"
IMAGE="${AGENTRUN_KIND_IMAGE:-agentrun-operator:kind}"
RUNNER_IMAGE="${AGENTRUN_KIND_RUNNER_IMAGE:-busybox:1.36}"
RELEASE_NS="agentrun-system"
CACHE="${AGENTRUN_CACHE_DIR:-$HOME/.cache/agentrun-operator}"
STATE="${AGENTRUN_KIND_STATE:-$CACHE/kind-state}"
KUBECONFIG_FILE="$STATE/$CLUSTER.kubeconfig"

say() { printf 'kind.sh: %s\n' "$*" >&2; }

check() {
  if ! command -v docker >/dev/null 2>&1; then
    say "no docker client on PATH: the kind path needs a Docker engine"
    return 3
  fi
  local err
  if ! err="$(docker info --format '{{.ServerVersion}}' 2>&1)"; then
    say "no Docker engine answers ($(printf '%s' "$err" | tail -n 1))"
    return 3
  fi
}

images() {  # kind's node image must be local or pullable: no registry, no kind cluster
  check
  if docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1 \
    || docker image inspect "${KIND_NODE_IMAGE%@*}" >/dev/null 2>&1; then
    return 0
  fi
  local err
  if ! err="$(timeout "${AGENTRUN_KIND_PULL_TIMEOUT:-120}" docker pull "$KIND_NODE_IMAGE" 2>&1)"; then
    say "kind's node image ${KIND_NODE_IMAGE%@*} is not here and cannot be pulled ($(printf '%s' "$err" | tail -n 1)); with registry access run \`make kind\`, or \`docker load\` the image first"
    return 4
  fi
}

tool() {  # tool NAME: print the path of a tool, building kind or the control-plane tools if needed
  local name="$1"
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  case "$name" in
    kind)
      local bin="$CACHE/kind/$KIND_VERSION/bin"
      if [ ! -x "$bin/kind" ]; then
        command -v go >/dev/null 2>&1 || { say "kind is not on PATH and Go is not there to build it"; exit 1; }
        say "building kind $KIND_VERSION with $(go version)"
        GOBIN="$bin" go install "sigs.k8s.io/kind@$KIND_VERSION"
      fi
      echo "$bin/kind" ;;
    helm|kubectl)
      local bin
      bin="$("$REPO/.venv/bin/agentrun" dev tools | tail -n 1)"
      echo "$bin/$name" ;;
  esac
}

up() {
  images
  local kind helm kubectl
  kind="$(tool kind)"; helm="$(tool helm)"; kubectl="$(tool kubectl)"
  mkdir -p "$STATE"

  say "building $IMAGE from the Dockerfile"
  docker build --tag "$IMAGE" --build-arg "REVISION=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$REPO"
  docker run --rm "$IMAGE" --version

  if "$kind" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "reusing kind cluster $CLUSTER"
  else
    say "creating kind cluster $CLUSTER ($KIND_NODE_IMAGE)"
    "$kind" create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --wait 180s
  fi
  "$kind" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
  export KUBECONFIG="$KUBECONFIG_FILE"

  docker image inspect "$RUNNER_IMAGE" >/dev/null 2>&1 || docker pull "$RUNNER_IMAGE"
  "$kind" load docker-image --name "$CLUSTER" "$IMAGE" "$RUNNER_IMAGE"

  "$kubectl" create namespace "$RELEASE_NS" --dry-run=client -o yaml | "$kubectl" apply -f -
  # CRDs: helm installs crds/ only on first install; apply them so a reused cluster is current too.
  "$kubectl" apply --server-side --force-conflicts -f "$REPO/charts/agentrun-operator/crds/"
  say "helm upgrade --install agentrun-operator (loops on)"
  "$helm" upgrade --install agentrun-operator "$REPO/charts/agentrun-operator" \
    --namespace "$RELEASE_NS" \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set runner.image="$RUNNER_IMAGE" \
    --set loops.enabled=true \
    --set resyncSeconds=10 \
    --wait --timeout 5m
  "$kubectl" -n "$RELEASE_NS" rollout status deployment/agentrun-operator --timeout=3m
  echo "KUBECONFIG=$KUBECONFIG_FILE"
}

down() {
  local kind
  kind="$(tool kind)"
  "$kind" delete cluster --name "$CLUSTER"
  rm -f "$KUBECONFIG_FILE"
}

case "${1:-}" in
  check) check ;;
  images) images ;;
  up) up ;;
  down) down ;;
  env) echo "KUBECONFIG=$KUBECONFIG_FILE" ;;
  *) say "usage: $0 check|images|up|down|env"; exit 2 ;;
esac
