#!/usr/bin/env bash
# Builds and tags the seven service images and the three trainer images, and
# optionally pushes them. Needs docker (or a compatible CLI in $DOCKER).
#
#   scripts/images.sh [--registry REGISTRY] [--tag TAG] [--push]
#
# REGISTRY defaults to ghcr.io/trainyard, TAG to the workspace version. Then
# point the manifests at them: the printed `kustomize edit set image` lines, run
# in deploy/, and the planner's default_images.* for the trainer images.
set -euo pipefail
cd "$(dirname "$0")/.."
registry=ghcr.io/trainyard
tag=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | sed -n 1p)
push=no
docker=${DOCKER:-docker}
usage="usage: scripts/images.sh [--registry REGISTRY] [--tag TAG] [--push]"
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2:?$usage}"; shift 2 ;;
    --tag) tag="${2:?$usage}"; shift 2 ;;
    --push) push=yes; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
command -v "$docker" >/dev/null || { echo "$docker not found: set DOCKER or install a container runtime" >&2; exit 1; }

services=(watcher planner gpu-allocator hpo-tuner checkpoint-manager cost-optimizer notifier)
images=()
for service in "${services[@]}"; do
  image="$registry/$service:$tag"
  echo "== $image"
  "$docker" build -f deploy/Dockerfile --build-arg SERVICE="$service" -t "$image" .
  images+=("$image")
done
for framework in pytorch tensorflow jax; do
  image="$registry/trainer-$framework:$tag"
  echo "== $image"
  "$docker" build -f "deploy/trainer/$framework.Dockerfile" -t "$image" .
  images+=("$image")
done
if [ "$push" = yes ]; then
  for image in "${images[@]}"; do "$docker" push "$image"; done
fi
echo
echo "in deploy/:"
for service in "${services[@]}"; do
  echo "  kustomize edit set image ghcr.io/trainyard/$service=$registry/$service:$tag"
done
echo "planner config: default_images.{pytorch,tensorflow,jax} = $registry/trainer-<framework>:$tag"
