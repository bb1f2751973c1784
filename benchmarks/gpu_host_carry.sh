#!/usr/bin/env bash
# What benchmarks/gpu_host.py needs on a lent GPU machine with no network, carried in parts that fit beside the
# working tree: each call to the machine carries the checkout (about 52 MiB, the shipped model included) and at most
# 64 MiB in all, so the wheels the machine's image lacks (FAISS, FastAPI and its stack, fastapi-offline for /docs) and MiniLM's tokenizer travel
# as parts of at most 9 MiB, one part a call, appended to $CARRY (default $HOME/gpu) on the machine while it stays warm.
#
#   here:   benchmarks/gpu_host_carry.sh pack          wheels + tokenizer.json → .gpu/1, .gpu/2, … (git-ignored)
#   there:  benchmarks/gpu_host_carry.sh keep N        (a call carrying .gpu/N) append part N to $CARRY
#   there:  benchmarks/gpu_host_carry.sh keep-all      (a call carrying .gpu) all parts at once, when they fit
#   there:  benchmarks/gpu_host_carry.sh run [ARGS]    (the last call) unpack, install into $SITE (default /tmp/site), run
#                                                      gpu_host.py (ARGS passed on: e.g. --serve-workers 8) and write
#                                                      $OUT/gpu_host_cuda_<gpu>.json (about 11 minutes on an H200
#                                                      before the profiled build, about 30 s more, was added;
#                                                      --big-photos 0 --skip decode: within a call's 10)
#
# The versions are the pinned ones of constraints.txt, for the machine's Python 3.12. The pretrained-weight packages
# are not carried: gpu_host.py builds the shipped architecture with load_weights=False (speed does not depend on
# the weights) and says so in its results. docs/benchmarks.md has the calls.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${CARRY:-$HOME/gpu}
SITE=${SITE:-/tmp/site}
WHEELS="faiss-cpu fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv python-multipart
httptools annotated-types typing-inspection fastapi-offline
opentelemetry-api threadpoolctl"

pin() {   # pin NAME: NAME==VERSION from constraints.txt (any spelling of - and _)
    local want
    want=$(echo "$1" | tr '_' '-' | tr '[:upper:]' '[:lower:]')
    awk -F'==' -v w="$want" '{n=tolower($1); gsub("_","-",n); if (n==w) {print $1"=="$2; exit}}' constraints.txt
}

case "${1:-}" in
pack)
    rm -rf .gpu && mkdir -p .gpu/carry/wheels
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    specs=()
    for name in $WHEELS; do
        spec=$(pin "$name"); [ -n "$spec" ] || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
        specs+=("$spec")
    done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .gpu/carry/wheels "${specs[@]}"
    .venv/bin/python benchmarks/gpu_host.py --write-tokenizer .gpu/carry/tokenizer.json
    tar -C .gpu -cf .gpu/carry.tar carry
    split -b 9M -d -a 1 .gpu/carry.tar .gpu/part.
    n=0
    for part in .gpu/part.*; do n=$((n + 1)); mkdir -p ".gpu/$n"; mv "$part" ".gpu/$n/"; done
    rm -rf .gpu/carry .gpu/carry.tar
    du -sh .gpu/*
    echo "$n parts: one call each, carrying .gpu/N: benchmarks/gpu_host_carry.sh keep N; then ... run"
    ;;
keep-all)   # one call carrying all of .gpu/, where the checkout and the parts fit together in 64 MiB
    mkdir -p "$CARRY" && rm -f "$CARRY/carry.tar"
    for n in $(ls .gpu | sort -n); do cat ".gpu/$n"/part.* >> "$CARRY/carry.tar"; done
    ls -la "$CARRY/carry.tar"
    ;;
keep)
    mkdir -p "$CARRY"
    cat ".gpu/$2"/part.* >> "$CARRY/carry.tar"
    ls -la "$CARRY/carry.tar"
    ;;
run)
    shift
    tar -xf "$CARRY/carry.tar" -C "$CARRY"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$CARRY/carry/wheels/"*.whl
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    python3 benchmarks/gpu_host.py --random-weights --tokenizer "$CARRY/carry/tokenizer.json" --out-dir "${OUT:-.}" "$@"
    ;;
*)
    sed -n '2,15p' "$0"; exit 2 ;;
esac
