#!/usr/bin/env bash
# End-to-end check of the container deployment (docs/deploy.md), on any host with Docker (compose v2) or Podman:
# builds the image, makes the demo gallery and a demo-architecture model inside a container (synthetic images;
# an untrained model: nothing is trained, the weights do not matter here), indexes the gallery inside the
# container exactly as the docs say (compose run ... index build), starts the service with compose, and queries
# it from the host. Then the `replicas` profile: SMOKE_REPLICAS replicas behind the proxy's one port, sharing the
# index read-only; a new generation written by a one-off run reaches every replica without a restart.
# The folders are fresh host directories mounted as in docker-compose.yml, owned by the container's user: the
# user running this script (JOINTSPACE_UID/GID), or, when that is root, the image's own user 10001, to whom the
# folders are chown-ed (docs/deploy.md); nothing is chmod-ed and the container never runs as root.
#
#   deploy/smoke.sh       # SMOKE_PORT=18000, SMOKE_REPLICA_PORT=18080, SMOKE_REPLICAS=2, ENGINE=docker|podman,
#                         # BASE_IMAGE (the images' base, when the default cannot be pulled: docs/deploy.md)
#
# Uses deploy/compose.cpu.yaml (no GPU reservation, encoders on the CPU), so a GPU is not needed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
port=${SMOKE_PORT:-18000}
replica_port=${SMOKE_REPLICA_PORT:-18080}
replicas=${SMOKE_REPLICAS:-2}
engine=${ENGINE:-}
if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null 2>&1; then engine=podman
    else echo "deploy/smoke.sh: no container engine (docker or podman) found" >&2; exit 3
    fi
fi
"$engine" compose version >/dev/null 2>&1 || { echo "deploy/smoke.sh: '$engine compose' is not available" >&2; exit 3; }
# Podman (itself, or behind the docker CLI through its Docker-compatible API) has no BuildKit for compose to use:
# DOCKER_BUILDKIT=0 makes compose build with the engine's classic build API, which Podman serves with Buildah
if [ "$engine" = podman ] || "$engine" version --format '{{range .Server.Components}}{{.Name}} {{end}}' 2>/dev/null \
        | grep -q 'Podman Engine'; then
    export DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0}
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jointspace-smoke.XXXXXX")
mkdir -p "$work/models" "$work/indexes" "$work/images"
export COMPOSE_PROJECT_NAME=jointspace-smoke
export JOINTSPACE_MODELS="$work/models" JOINTSPACE_INDEXES="$work/indexes" JOINTSPACE_IMAGES="$work/images"
export JOINTSPACE_UID JOINTSPACE_GID JOINTSPACE_PUBLISH="127.0.0.1:$port" JOINTSPACE_API_KEY=
export JOINTSPACE_REPLICAS="$replicas" JOINTSPACE_REPLICAS_PUBLISH="127.0.0.1:$replica_port"
JOINTSPACE_UID=$(id -u)
JOINTSPACE_GID=$(id -g)
if [ "$JOINTSPACE_UID" = 0 ]; then               # never run the container as root: the image's user owns the folders
    JOINTSPACE_UID=10001 JOINTSPACE_GID=10001
    chown 10001:10001 "$work/models" "$work/indexes" "$work/images"
fi
compose=("$engine" compose -f "$repo/docker-compose.yml" -f "$repo/deploy/compose.cpu.yaml")

cleanup() {
    status=$?
    if [ "$status" -ne 0 ]; then "${compose[@]}" --profile replicas logs --no-color --tail 80 || true; fi
    "${compose[@]}" --profile replicas down --volumes --timeout 20 >/dev/null 2>&1 || true
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
from training.data.datasets import load_dataset
from training.models.model import build_model, save_model
from training.data.vocab import Vocabulary
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

step "several replicas behind one port (profile replicas): $replicas replicas, the index mounted read-only"
"${compose[@]}" --profile replicas build proxy
"${compose[@]}" --profile replicas up -d proxy
replica_generation() {             # the generation replica $1 serves, asked inside its container (it has no port)
    "${compose[@]}" --profile replicas exec -T --index "$1" replica python -c '
import json, urllib.request
try:
    print(json.load(urllib.request.urlopen("http://127.0.0.1:8000/readyz", timeout=4))["index_generation"])
except OSError:
    print("not-ready")'
}
wait_for_generation() {            # every replica serves generation $1 (within 4 minutes: first start loads the model)
    for _ in $(seq 120); do
        local all=1
        for i in $(seq "$replicas"); do
            [ "$(replica_generation "$i")" = "$1" ] || { all=0; break; }
        done
        [ "$all" = 1 ] && return 0
        sleep 2
    done
    for i in $(seq "$replicas"); do echo "replica $i serves: $(replica_generation "$i")" >&2; done
    return 1
}
wait_for_generation "$gen" || { echo "the replicas did not all serve $gen" >&2; exit 1; }
for _ in $(seq 30); do curl -sf "http://127.0.0.1:$replica_port/readyz" >/dev/null && break; sleep 1; done
started=$("$engine" inspect -f '{{.Id}} {{.State.StartedAt}} {{.RestartCount}}' \
    $("${compose[@]}" --profile replicas ps -q replica))
[ "$(printf '%s\n' "$started" | wc -l)" = "$replicas" ] || { echo "not $replicas replicas: $started" >&2; exit 1; }
ids() { python3 -c 'import json, sys; print(*[r["id"] for r in json.load(sys.stdin)["results"]])'; }
for _ in $(seq $((3 * replicas))); do                 # spread over the replicas (leastconn), every answer the same
    through=$(curl -sf -X POST "http://127.0.0.1:$replica_port/v1/search/images" \
        -H 'content-type: application/json' -d '{"text": "a red circle above a blue square", "k": 3}')
    [ "$(printf '%s' "$through" | ids)" = "$(printf '%s' "$answer" | ids)" ] \
        || { echo "the proxy answered $through, the service $answer" >&2; exit 1; }
done
echo "the proxy on 127.0.0.1:$replica_port answers as the service does, over $replicas replicas"

step "a new index generation (written by a one-off run) reaches every replica without a restart"
"${compose[@]}" run --rm jointspace index remove --index /indexes/gallery --ids "$first"
new=$(cat "$work/indexes/gallery/CURRENT")
[ "$new" != "$gen" ] || { echo "index remove wrote no new generation" >&2; exit 1; }
wait_for_generation "$new" || { echo "the replicas did not pick up $new" >&2; exit 1; }
after=$(curl -sf -X POST "http://127.0.0.1:$replica_port/v1/search/images" -H 'content-type: application/json' \
    -d '{"text": "a red circle above a blue square", "k": 3}')
printf '%s' "$after" | python3 -c 'import json, sys; ids = [r["id"] for r in json.load(sys.stdin)["results"]]; assert int(sys.argv[1]) not in ids, ids' "$first" \
    || { echo "the removed image $first is still found through the proxy: $after" >&2; exit 1; }
[ "$("$engine" inspect -f '{{.Id}} {{.State.StartedAt}} {{.RestartCount}}' \
    $("${compose[@]}" --profile replicas ps -q replica))" = "$started" ] \
    || { echo "a replica was restarted" >&2; exit 1; }
echo "every replica serves $new (image $first removed), none restarted"

echo
echo "deploy/smoke.sh: OK (image built, gallery indexed in the container, queried on 127.0.0.1:$port;" \
    "$replicas replicas behind 127.0.0.1:$replica_port reloaded a new generation)"
