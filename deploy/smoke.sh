#!/usr/bin/env bash
# End-to-end check of the container deployment (docs/deploy.md), on any host with Docker (compose v2) or Podman:
# builds the image, makes the demo gallery and a demo-architecture model inside a container (synthetic images;
# an untrained model: nothing is trained, the weights do not matter here), indexes the gallery inside the
# container exactly as the docs say (compose run ... index build), starts the service with compose, and queries
# it from the host. The folders are fresh host directories owned by the user running this script, mounted as in
# docker-compose.yml; the container runs as that user (JOINTSPACE_UID/GID), so nothing is chmod-ed.
#
#   deploy/smoke.sh                 # SMOKE_PORT=18000, ENGINE=docker|podman (default: whichever is found)
#
# Uses deploy/compose.cpu.yaml (no GPU reservation, encoders on the CPU), so a GPU is not needed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
port=${SMOKE_PORT:-18000}
engine=${ENGINE:-}
if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null 2>&1; then engine=podman
    else echo "deploy/smoke.sh: no container engine (docker or podman) found" >&2; exit 3
    fi
fi
"$engine" compose version >/dev/null 2>&1 || { echo "deploy/smoke.sh: '$engine compose' is not available" >&2; exit 3; }

work=$(mktemp -d "${TMPDIR:-/tmp}/jointspace-smoke.XXXXXX")
mkdir -p "$work/models" "$work/indexes" "$work/images"
export COMPOSE_PROJECT_NAME=jointspace-smoke
export JOINTSPACE_MODELS="$work/models" JOINTSPACE_INDEXES="$work/indexes" JOINTSPACE_IMAGES="$work/images"
export JOINTSPACE_UID JOINTSPACE_GID JOINTSPACE_PUBLISH="127.0.0.1:$port" JOINTSPACE_API_KEY=
JOINTSPACE_UID=$(id -u)
JOINTSPACE_GID=$(id -g)
compose=("$engine" compose -f "$repo/docker-compose.yml" -f "$repo/deploy/compose.cpu.yaml")

cleanup() {
    status=$?
    if [ "$status" -ne 0 ]; then "${compose[@]}" logs --no-color --tail 80 || true; fi
    "${compose[@]}" down --volumes --timeout 20 >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "build the image"
"${compose[@]}" build

step "the demo gallery and a demo-architecture model, made inside a container (nothing is trained)"
"$engine" run --rm --user "$JOINTSPACE_UID:$JOINTSPACE_GID" -v "$work/images:/images" jointspace:gpu \
    synth --out /images --images 120 --seed 0
"$engine" run --rm --user "$JOINTSPACE_UID:$JOINTSPACE_GID" -v "$work/images:/images:ro" -v "$work/models:/models" \
    --entrypoint python jointspace:gpu -c '
import torch
from training.config import load_config
from training.data import load_dataset
from training.model import build_model, save_model
from training.vocab import Vocabulary
data = load_dataset("/images")
torch.manual_seed(0)
vocab = Vocabulary.build((c for r in data.split("train").images for c in r.captions), min_count=1)
save_model(build_model(load_config("/opt/jointspace/configs/demo.yaml"), vocab), "/models/model.pt")
'
[ "$(stat -c %a "$work/models/model.pt")" = 644 ] || { echo "model.pt is not 0644" >&2; exit 1; }

step "index the demo gallery inside the container (docs/deploy.md)"
"${compose[@]}" run --rm jointspace index build --model /models/model.pt --data /images --split test \
    --out /indexes/gallery --device cpu
gen=$(cat "$work/indexes/gallery/CURRENT")
[ "$(stat -c %u "$work/indexes/gallery/$gen/manifest.json")" = "$JOINTSPACE_UID" ] \
    || { echo "the index is not owned by the host user" >&2; exit 1; }
[ "$(stat -c %a "$work/indexes/gallery/$gen")" = 755 ] && [ "$(stat -c %a "$work/indexes/gallery/$gen/manifest.json")" = 644 ] \
    || { echo "the index generation is not 0755/0644" >&2; exit 1; }

step "serve and query"
"${compose[@]}" up -d
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 2
done
curl -sf "http://127.0.0.1:$port/readyz"; echo
answer=$(curl -sf -X POST "http://127.0.0.1:$port/v1/search/images" -H 'content-type: application/json' \
    -d '{"text": "a red circle above a blue square", "k": 3}')
echo "$answer"
first=$(printf '%s' "$answer" | python3 -c 'import json, sys; r = json.load(sys.stdin)["results"]; assert len(r) == 3, r; print(r[0]["id"])')
curl -sf -o /dev/null "http://127.0.0.1:$port/v1/images/$first?size=64"
status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/v1/search/images" \
    -H 'content-type: application/json' -d '{"text": "   "}')
[ "$status" = 422 ] || { echo "blank text answered $status, not 422" >&2; exit 1; }
echo
echo "deploy/smoke.sh: OK (image built, gallery indexed in the container, queried on 127.0.0.1:$port)"
