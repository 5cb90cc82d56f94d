#!/usr/bin/env bash
# The GPU lane: everything nemo_opd claims about GPUs, in one device call of at most 8 minutes.
#
#   bash benchmarks/gpu_lane.sh             # on a machine with one CUDA GPU
#   bash benchmarks/gpu_lane.sh --dry-run   # the same steps on a CPU: tiny shapes, Triton's
#                                           # interpreter (the test suite runs this)
#   bash benchmarks/gpu_lane.sh b_topk d_engine   # only these steps (a rerun)
#   bash benchmarks/gpu_lane.sh env g_loop h_shapes   # the loop steps: a device call of their own
#   bash benchmarks/gpu_lane.sh env f_full i_liger j_prefix   # at scale: 9 min, a call
#
# The steps' time limits add up to 8 minutes (env 45 s, a 110, b 100, c 80, d 110, e 35);
# f_full (150 s) runs when named (`bash benchmarks/gpu_lane.sh f_full`) or with --all, and so do
# the loop steps (env 45 s, g 240, h 190: another 8 minutes), i_liger (150 s) and j_prefix
# (180 s).
# Steps, in order, each time-boxed (`timeout`) and each writing its log and results before the
# next starts, so a step that fails or runs long never costs the others:
#   env       the device, the versions, and the imports every later step needs
#   a_kernel  the Triton kernel compiled for real: the kernel tests (gpu-marked included) on
#             CUDA, fp32 and bf16, against the float64 reference, and torch's varlen flash
#             attention for packed rows (test_segment_attention.py); a pass/fail table
#   b_topk    benchmarks/bench_topk_kl.py at V = 151936, k 64 and 128, N 4096 and 16384, bf16,
#             the training path: fused kernel, torch twin, NeMo-RL's algorithm; the copy
#             bandwidth and the fraction of the traffic bound; a vocabulary-block sweep
#   c_scale   benchmarks/bench_scale.py at V = 151936, H = 2048: chunked vs unchunked
#   d_engine  the DTensor engine in process (world size 1, no Ray): a Qwen3-1.7B-shaped model's
#             training and teacher top-k tokens/s, packed rows attending per segment and in one
#             varlen call; the tiny models on the GPU against the CPU
#   e_mcore   megatron-core on the GPU (no CPU shim): the same tiny-model parity
#   f_full    benchmarks/bench_scale.py's exact full-vocabulary path (loss_fn.support full)
#             beside the chunked top-k path, at V = 151936, H = 1024 and 2048
#   g_loop    benchmarks/bench_loop.py tiny: the tiny default end to end on the GPU in one
#             process (local executor, transformers engine, no Ray, no vLLM, lockstep): its time
#             and held-out accuracy against the same command's on a CPU (TINY_CPU_ACCURACY)
#   h_shapes  benchmarks/bench_loop.py shapes: the single-GPU recipe's models (Qwen3-1.7B-Base
#             and Qwen3-8B shapes, random weights) through refit, generation, the teacher and
#             training: seconds and peak memory per phase, tokens/s
#   i_liger   benchmarks/bench_vs_liger.py: the student's loss path (the full-vocabulary JSD)
#             in bf16 beside Liger-Kernel's fused and chunked JSD, at Liger's benchmark shape
#             and Qwen3's vocabulary: time, memory, gradients against float64
#   j_prefix  benchmarks/bench_engine.py prefix: a Qwen3-8B-shaped teacher's top-k of 4 prompts
#             x 16 samples, each row whole against shared-prefix scoring
#
# Carried wheels (benchmarks/gpu_wheels.py builds them into .whl/) are installed first when
# present. Results: $OUT/summary.md (a table of the steps, then each step's own table) and
# $OUT/lane.tgz (every log and JSON), both rewritten after every step. OUT defaults to
# runs/gpu_lane; PYTHON to python3.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
ALL=0
if [[ "${1:-}" == "--all" ]]; then ALL=1; shift; fi
ONLY=" $* "  # the steps to run; the default ones when none is named
OPTIONAL=" f_full g_loop h_shapes i_liger j_prefix "  # run only when named, or with --all
TINY_CPU_ACCURACY=${TINY_CPU_ACCURACY:-0.596}  # the same command's held-out accuracy on a CPU
# (bench_loop.py tiny --device cpu, docs/benchmarks.md); g_loop passes within 2 points of it
OUT=${OUT:-$ROOT/runs/gpu_lane}
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_lane.XXXXXX")
mkdir -p "$OUT" "$WORK/logs" "$WORK/results"
SUMMARY=$OUT/summary.md
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
LANE_START=$(date +%s)

if [[ -d .whl ]] && compgen -G ".whl/*.whl" > /dev/null && [[ $DRY == 0 ]]; then
    SITE=$WORK/site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        .whl/*.whl || { echo "error: the carried wheels did not install"; exit 1; }
    export PYTHONPATH=$PYTHONPATH:$SITE
fi

{
    echo "# GPU lane, $(date -u +%Y-%m-%dT%H:%M:%SZ)$([[ $DRY == 1 ]] && echo ', dry run')"
    echo
    echo "| step | status | seconds | limit |"
    echo "| --- | --- | --- | --- |"
} > "$SUMMARY.steps"
: > "$SUMMARY.tables"

publish() {  # summary.md = the step table, then each step's own table; lane.tgz = everything
    cat "$SUMMARY.steps" "$SUMMARY.tables" > "$SUMMARY"
    tar czf "$OUT/lane.tgz" -C "$WORK" logs results 2> /dev/null
}

# step NAME LIMIT_S TABLE_LINES COMMAND...: run COMMAND time-boxed, log under logs/NAME.log,
# record its status, and copy the last TABLE_LINES lines of its log into the summary.
step() {
    local name=$1 limit=$2 lines=$3
    shift 3
    if [[ "$ONLY" != "  " && "$ONLY" != *" $name "* ]]; then return; fi
    if [[ "$ONLY" == "  " && $ALL == 0 && "$OPTIONAL" == *" $name "* ]]; then return; fi
    local start status
    start=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout -k 10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    case $? in
        0) status=pass ;;
        124 | 137) status="TIMEOUT" ;;
        *) status="FAIL" ;;
    esac
    local took=$(($(date +%s) - start))
    echo "| $name | $status | $took | $limit |" >> "$SUMMARY.steps"
    {
        echo
        echo "## $name: $status"
        echo
        echo '```'
        tail -n "$lines" "$WORK/logs/$name.log"
        echo '```'
    } >> "$SUMMARY.tables"
    echo "   $status in ${took}s"
    publish
}

RES=$WORK/results
if [[ $DRY == 1 ]]; then
    DEVICE=cpu
    KERNEL_ENV=(env TRITON_INTERPRET=1)
    KERNEL_TESTS=(-k "test_odd_shapes or test_gpu or (test_matches_brute_force and reverse-bucket)")
    TOPK_ARGS=(--device cpu --quick --block-v 128 256 --inplace --profile)
    SCALE_ARGS=(--device cpu --vocab 4096 --hidden 64 --tokens 64 --k 16 --chunk 32 --repeats 1)
    ENGINE_ARGS=(--device cpu --shape tiny --precision float32 --rows 4 --seq 64 --micro 2 --k 8
        --chunk 32 --repeats 1)
    FULL_ARGS=(--device cpu --vocab 4096 --tokens 64 --k 16 --chunk 32 --repeats 1)
    FULL_HIDDEN=(64)
    LOOP_ARGS=(--device cpu --steps 2 --val-samples 8 --deadline-s 220)
    SHAPES_ARGS=(--device cpu --student tiny --teacher tiny --rows 8 --prompt-len 16
        --new-tokens 16 --warmup 0 --steps 1 --threads 2 --copy-refit)
    LIGER_ARGS=(--device cpu --tokens 64 --hidden 32 --vocab 1024 --grad-tokens 32 --warmup 0
        --repeats 1)
    PREFIX_ARGS=(--device cpu --shape tiny --precision float32 --prompts 2 --samples 4
        --prompt-len 32 --new-tokens 16 --mb-tokens 256 --k 8 --chunk 32 --repeats 1)
    XDIST=()
else
    DEVICE=cuda
    KERNEL_ENV=(env)
    KERNEL_TESTS=()
    TOPK_ARGS=(--device cuda --vocab 151936 --k 64 128 --n 4096 16384 --dtype bf16
        --block-v 1024 2048 4096 8192 --inplace --profile)
    SCALE_ARGS=(--device cuda --vocab 151936 --hidden 2048 --tokens 4096 16384 --k 64
        --chunk 1024 --repeats 3 --memory-gb 0)
    ENGINE_ARGS=(--device cuda --shape qwen3-1.7b --precision bfloat16 --rows 16 --seq 2048
        --micro 2 --k 64 --chunk 1024 --repeats 2 --packed-attention per_segment varlen)
    FULL_ARGS=(--device cuda --vocab 151936 --tokens 4096 16384 --k 64 --chunk 1024 --repeats 3
        --memory-gb 0)
    FULL_HIDDEN=(1024 2048)
    LOOP_ARGS=(--device cuda --reference-accuracy "$TINY_CPU_ACCURACY" --deadline-s 220)
    SHAPES_ARGS=(--device cuda --student qwen3-1.7b-base --teacher qwen3-8b --rows 64
        --prompt-len 256 --new-tokens 512 --warmup 1 --steps 2 --copy-refit)
    LIGER_ARGS=(--device cuda)
    PREFIX_ARGS=(--device cuda --shape qwen3-8b --precision bfloat16 --prompts 4 --samples 16
        --prompt-len 512 --new-tokens 512 --mb-tokens 16384 --k 64 --chunk 1024 --repeats 2)
    XDIST=(-n 8)
fi

step env 45 40 bash -c "
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv \
        2> /dev/null || echo 'nvidia-smi: none here'
    '$PY' benchmarks/gpu_lane_report.py env"

step a_kernel 110 60 "${KERNEL_ENV[@]}" bash -c "
    xdist='${XDIST[*]}'
    '$PY' -c 'import xdist' 2> /dev/null || xdist=''  # pytest-xdist: compile in parallel
    '$PY' -m pytest -q -p no:cacheprovider \$xdist -o addopts='' \
        tests/unit/ops/test_topk_kl_triton.py tests/unit/distributed/test_segment_attention.py \
        --junitxml='$RES/kernel.xml' ${KERNEL_TESTS[*]@Q}
    status=\$?
    '$PY' benchmarks/gpu_lane_report.py junit '$RES/kernel.xml'
    exit \$status"

step b_topk 100 120 "${KERNEL_ENV[@]}" "$PY" benchmarks/bench_topk_kl.py "${TOPK_ARGS[@]}" \
    --paths training --json "$RES/topk_kl.json"

step c_scale 80 20 "$PY" benchmarks/bench_scale.py "${SCALE_ARGS[@]}" --impls chunked unchunked \
    --json "$RES/scale.json"

step d_engine 110 20 bash -c "
    set -e
    '$PY' benchmarks/bench_engine.py throughput ${ENGINE_ARGS[*]} --json '$RES/engine.json'
    '$PY' benchmarks/bench_engine.py parity --device cpu --json '$RES/parity_cpu.json'
    if [[ $DEVICE == cpu ]]; then  # a dry run: the CPU's figures are the device's
        cp '$RES/parity_cpu.json' '$RES/parity_dtensor.json'
    else
        '$PY' benchmarks/bench_engine.py parity --device $DEVICE --json '$RES/parity_dtensor.json'
    fi
    '$PY' benchmarks/bench_engine.py compare '$RES/parity_cpu.json' '$RES/parity_dtensor.json'"

step e_mcore 35 12 bash -c "
    set -e
    '$PY' benchmarks/bench_engine.py parity --device $DEVICE --backend megatron \
        --json '$RES/parity_megatron.json'
    test -f '$RES/parity_cpu.json' || '$PY' benchmarks/bench_engine.py parity --device cpu \
        --json '$RES/parity_cpu.json'
    '$PY' benchmarks/bench_engine.py compare '$RES/parity_cpu.json' '$RES/parity_megatron.json'"

step f_full 150 40 bash -c "
    set -e
    for hidden in ${FULL_HIDDEN[*]}; do
        '$PY' benchmarks/bench_scale.py ${FULL_ARGS[*]} --hidden \$hidden --impls chunked full \
            --json '$RES'/full_vocab_h\$hidden.json
    done"

step g_loop 240 14 bash -c "
    '$PY' benchmarks/bench_loop.py tiny ${LOOP_ARGS[*]} --run-dir '$WORK/loop_tiny' \
        --json '$RES/loop_tiny.json'
    status=\$?  # the run's metrics and output kept (its checkpoints are not)
    cp '$WORK/loop_tiny/logs/metrics.jsonl' '$RES/loop_tiny_metrics.jsonl' 2> /dev/null
    cp '$WORK/loop_tiny/command.log' '$WORK/logs/g_loop_command.log' 2> /dev/null
    exit \$status"

step h_shapes 190 16 "$PY" benchmarks/bench_loop.py shapes "${SHAPES_ARGS[@]}" --tmp "$WORK" \
    --json "$RES/loop_shapes.json"

step i_liger 150 24 "$PY" benchmarks/bench_vs_liger.py "${LIGER_ARGS[@]}" --json "$RES/liger.json"

step j_prefix 180 6 "$PY" benchmarks/bench_engine.py prefix "${PREFIX_ARGS[@]}" --tmp "$WORK" \
    --json "$RES/prefix.json"

echo "lane finished in $(($(date +%s) - LANE_START))s"
cat "$SUMMARY"
grep -q "| \(FAIL\|TIMEOUT\) |" "$SUMMARY.steps" && exit 1
exit 0
