#!/usr/bin/env bash
# Every figure and check that needs a CUDA GPU, in one run sized for a short lease (issue 38):
# the most valuable steps first, each under a time cap, all of them within GPU_CHECK_BUDGET
# seconds (default 540), so a lease cut short still brings back the figures of the steps that
# ran. Default steps, in order (expected seconds on an H100 in brackets):
#
#   fused_adam       FusedAdam kernel / PyTorch path vs torch AdamW(fused), fp32 + bf16, and
#                    FusedLamb; JIT builds included                                     [~90]
#   inference        ~1.1B Llama, HF eager generate vs kernel inject + CUDA graphs, batch 1
#                    and 8, identical tokens; int8 weight-only memory                   [~60]
#   zero_offload     ZeRO-2 all on the GPU vs CPU offload (pinned) at the deepest common
#                    model, offload beyond what the GPU holds, NVMe path; largest sizes [~170]
#   transformer      DeepSpeedTransformerLayer vs HF BertLayer, fp16 + bf16, fwd+bwd     [~30]
#   sparse_attention Fixed pattern vs flash SDPA at 4K and 16K, blocks 16 and 64         [~60]
#   evoformer        DS4Sci_EvoformerAttention vs naive at N_res 256 / 384              [~30]
#   zeropp_kernels   ZeRO++ int8 / int4 quantization GB/s vs the device's bandwidth     [~20]
#   tests            the GPU tests of this work (fused CUDA ops, CUDA-graph inference)  [~80]
#
# Opt-in steps (GPU_CHECK_ONLY names them): tests_all (every GPU-marked and CUDA-skipping test
# file, ~5 min), ds_report, demo (the README demo through the launcher on one GPU).
#
#   bash tools/gpu_check.sh                               # on the GPU machine
#   GPU_CHECK_ONLY="tests zeropp_kernels" bash tools/gpu_check.sh       # a re-run of two steps
#   GPU_CHECK_SKIP="zero_offload" bash tools/gpu_check.sh               # leave steps out
#   GPU_CHECK_DRY_RUN=1 bash tools/gpu_check.sh           # here: every step at a tiny size on
#                                                         # the CPU, or skipped with the reason
#   bash tools/gpu_check.sh --fetch-wheels                # here, before a lease: the missing
#                                                         # packages as wheels in ./.whl
#
# Left in $OUT (or ./gpu_check_out), at most 8 files as the lease returns them: steps.log (every
# step's output, appended as each ends), steps.tsv (name, exit code, seconds, limit, status),
# env.txt, figures.jsonl (one record per benchmark), summary.md / summary.json (rewritten after
# every step by tools/bench/gpu_summary.py), current_step.txt (only while a step runs, or when
# the run was killed inside one). Wheels in ./.whl (pydantic and hjson, which the GPU image
# lacks) are installed first; carry .whl with the call.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1

if [ "${1:-}" = "--fetch-wheels" ]; then  # on this (networked) machine, for the GPU image
    # the versions constraints.txt's dev environment resolves to (pydantic's needs included)
    WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
            typing-inspection==0.4.5 typing-extensions==4.16.0 hjson==3.1.0"
    mkdir -p .whl
    # shellcheck disable=SC2086  # one argument per wheel
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl $WHEELS && ls .whl
    exit $?
fi

OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
: >"$OUT/steps.log"
: >"$OUT/steps.tsv"
: >"$OUT/figures.jsonl"
FIG="$OUT/figures.jsonl"
DRY=${GPU_CHECK_DRY_RUN:-0}
BUDGET=${GPU_CHECK_BUDGET:-540}
SLACK=1  # a dry run's time limits are only against hangs: a shared CPU may be slow
if [ "$DRY" = 1 ]; then BUDGET=${GPU_CHECK_BUDGET:-3600}; SLACK=5; fi
export PYTHONUNBUFFERED=1
# the interpreter: $PYTHON, else this checkout's .venv (a dry run here), else python3 (the GPU
# image's, which holds torch there)
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python

if [ "$DRY" = 1 ]; then
    DRYARG=--dry-run
    { echo "dry run on $(uname -m), no GPU needed"
      $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } \
        >"$OUT/env.txt" 2>&1
else
    DRYARG=
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gpu_check_ext}
    export MAX_JOBS=${MAX_JOBS:-16}
    # build the CUDA ops for the GPU in hand only: a JIT build for every arch takes minutes
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c \
        "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
    if compgen -G ".whl/*.whl" >/dev/null; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/gpu_check_site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
    fi
    $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      $PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
      nvcc --version | tail -n 2
      free -g | head -n 2; df -h /tmp | tail -n 1; nproc; } >"$OUT/env.txt" 2>&1
fi
cat "$OUT/env.txt"
PREBUILD_LOG=/tmp/gpu_check_prebuild.log
rm -f "$PREBUILD_LOG"
if [ "$DRY" != 1 ] && { [ -z "${GPU_CHECK_ONLY:-}" ] || [[ " $GPU_CHECK_ONLY " == *" zero_offload "* ]]; }; then
    # the host ops ZeRO-Offload needs build while the first steps run on the GPU (a benchmark
    # that needs one first waits on torch's build lock rather than building it again)
    $PY -c "from deepspeed.ops.op_builder import get_op_builder as g
for name in ('cpu_adam', 'async_io'): g(name)().load(verbose=False); print('built', name)" \
        >"$PREBUILD_LOG" 2>&1 &
fi
BIN=$($PY -c "import os, sys; print(os.path.dirname(sys.executable))")  # console scripts
START=$SECONDS

summarize() { $PY tools/bench/gpu_summary.py "$OUT" >/dev/null 2>&1; }

record() {  # record NAME RC SECONDS LIMIT STATUS
    printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$OUT/steps.tsv"
    echo "== $1: $5 (rc $2, $3 s of $4)"
}

# step NAME CAP MIN COMMAND...: run COMMAND with a time limit of CAP seconds, or less when the
# budget has less left; skipped (with the reason) when GPU_CHECK_SKIP names it, GPU_CHECK_ONLY
# does not, or fewer than MIN seconds of the budget are left.
step() {
    local name=$1 cap=$(($2 * SLACK)) min=$3
    shift 3
    case " ${GPU_CHECK_SKIP:-} " in
        *" $name "*) record "$name" - 0 0 "skipped: GPU_CHECK_SKIP"; return ;;
    esac
    if [ -n "${GPU_CHECK_ONLY:-}" ]; then
        case " $GPU_CHECK_ONLY " in *" $name "*) ;; *) return ;; esac
    fi
    local left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt "$min" ]; then
        record "$name" - 0 0 "skipped: ${left} s of the ${BUDGET} s budget left, it needs ${min}"
        summarize
        return
    fi
    local limit=$((cap < left ? cap : left))
    local begin=$SECONDS
    echo "### $name: $* (limit ${limit} s)" >"$OUT/current_step.txt"
    timeout --kill-after=10 "$limit" "$@" >>"$OUT/current_step.txt" 2>&1
    local rc=$?
    local status=ok
    [ "$rc" -ne 0 ] && status=failed
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="timed out"
    cat "$OUT/current_step.txt" >>"$OUT/steps.log"
    tail -n 12 "$OUT/current_step.txt"
    rm -f "$OUT/current_step.txt"
    record "$name" "$rc" $((SECONDS - begin)) "$limit" "$status"
    summarize
}

# skipped with its reason in a dry run (it needs a GPU)
gpu_only() {
    local name=$1
    shift
    if [ "$DRY" = 1 ]; then
        case " ${GPU_CHECK_ONLY:-$name} " in *" $name "*) record "$name" - 0 0 "skipped: $*" ;; esac
        return 1
    fi
}

B=tools/bench
step fused_adam 150 40 $PY $B/fused_adam_bench.py --params 200 --numel 1000000 --dtype fp32 bf16 \
    --lamb --json "$FIG" $DRYARG
step inference 120 40 $PY $B/inference_bench.py --cuda-graph --new_tokens 64 --prompt 32 \
    --json "$FIG" $DRYARG
# the lent kinds have 128 GiB of host memory, which a VM may report as less until it is used
OFFLOAD_BUDGET=${GPU_CHECK_OFFLOAD_BUDGET:-165}  # seconds the benchmark plans its runs in
step zero_offload $((OFFLOAD_BUDGET + 15)) 60 $PY $B/zero_offload_bench.py \
    --budget "$OFFLOAD_BUDGET" --json "$FIG" $DRYARG --host_gib "${GPU_CHECK_HOST_GIB:-120}"
step transformer 60 20 $PY $B/transformer_kernel_bench.py --json "$FIG" $DRYARG
step sparse_attention 75 25 $PY $B/sparse_attention_bench.py --seqs 4096 16384 --block 16 64 \
    --json "$FIG" $DRYARG
step evoformer 60 20 $PY $B/evoformer_bench.py --n-res 256 384 --json "$FIG" $DRYARG
step zeropp_kernels 40 15 $PY $B/zeropp_bench.py --kernels --json "$FIG" $DRYARG
TESTS="tests/op_builder/test_fused_cuda.py tests/plugins/inference/test_inference_cuda_graph.py
    tests/plugins/inference/test_inference_kernel_inject.py
    tests/plugins/sparse_attention/test_row_groups.py::test_row_groups_on_the_cuda_flash_kernel_equal_masked_dense"
if gpu_only tests "GPU tests: on this machine they skip (the CPU suite runs their CPU parts)"; then
    # shellcheck disable=SC2086  # the list is word-split on purpose
    # the nvcc compile checks and the Triton-interpreter test are the CPU suite's (minutes here)
    step tests 150 40 $PY -m pytest -q -rfs -p no:cacheprovider --timeout 140 \
        -k "not compiles and not interpreter" $TESTS
fi
ALL_TESTS=${GPU_CHECK_TESTS:-"tests/accelerators/test_accelerator_cuda.py
    tests/plugins/zero/test_zero_gpu.py tests/op_builder
    tests/core/optimizers/test_optimizer_behaviour.py tests/core/checkpoint/test_checkpoint_files.py
    tests/core/activation_checkpointing/test_ac_rng.py tests/plugins/zero/test_zero_nvme_swapper.py
    tests/plugins/sequence/test_sequence_offload.py tests/plugins/zero/test_zeropp_quantize.py
    tests/plugins/inference/test_inference_kernel_inject.py
    tests/plugins/inference/test_inference_cuda_graph.py
    tests/plugins/sparse_attention/test_triton_kernels.py tests/core/ops/test_transformer_kernel.py
    tests/core/ops/test_evoformer_attention.py tests/core/comm/test_comm_host_staging.py"}
if [ -n "${GPU_CHECK_ONLY:-}" ]; then  # the opt-in steps run only when named
    if gpu_only tests_all "GPU tests: on this machine they skip"; then
        # shellcheck disable=SC2086
        step tests_all 330 60 $PY -m pytest -q -rfs -p no:cacheprovider --timeout 200 \
            --durations=15 $ALL_TESTS
    fi
    if gpu_only ds_report "reports the CUDA ops of a GPU machine"; then
        step ds_report 60 10 "$BIN/ds_report"
    fi
    if gpu_only demo "the launcher's one-GPU NCCL run"; then
        step demo 90 30 "$BIN/deepspeed" --num_gpus 1 examples/train_demo.py --steps 40 \
            --print_every 10
    fi
fi
if [ -f "$PREBUILD_LOG" ]; then
    { echo "### prebuild of cpu_adam / async_io (background)"; cat "$PREBUILD_LOG"; } \
        >>"$OUT/steps.log"
fi
$PY tools/bench/gpu_summary.py "$OUT"
echo "gpu_check: $((SECONDS - START)) s of the ${BUDGET} s budget; logs and figures in $OUT"
