#!/usr/bin/env bash
# One pass over everything that only a CUDA machine can check, sized for a short GPU lease:
# ds_report, the GPU-marked and CUDA-skipping test files (CUDA accelerator, NCCL, the fused
# CUDA ops' build and numerics, ZeRO 0-3 and pinned CPU offload on one GPU, the CUDA RNG
# checkpoint round trip, the Triton kernels), the demo through the launcher on one GPU, and the
# FusedAdam benchmark. Each step's log lands in $OUT (or ./gpu_check_out), so a step that runs
# out of time still leaves the others' logs.
#
#   bash tools/gpu_check.sh            # on a machine with a GPU, torch and nvcc
#   GPU_CHECK_TESTS="tests/plugins/zero/test_zero_gpu.py" bash tools/gpu_check.sh   # fewer tests
#   GPU_CHECK_SKIP="ds_report evoformer" bash tools/gpu_check.sh                    # fewer steps
#
# Dependencies missing on that machine can be carried as wheels in ./.whl (installed first).
set -u
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/gpu_check_ext MAX_JOBS=${MAX_JOBS:-16}
# build the CUDA ops for the GPU in hand only: a JIT build for every arch takes minutes
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(python3 -c \
    "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}

step() {  # step NAME SECONDS COMMAND...: run with a time cap, log to $OUT/NAME.txt, say how it ended
    local name=$1 limit=$2; shift 2
    case " ${GPU_CHECK_SKIP:-} " in *" $name "*) echo "== $name: skipped"; return ;; esac
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: rc $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    tail -n 4 "$OUT/$name.txt"
}

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu_check_site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
BIN=$(python3 -c "import os, sys; print(os.path.dirname(sys.executable))")  # console scripts

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -n 2; } | tee "$OUT/summary.txt"

step ds_report 60 "$BIN/ds_report"
step demo 90 "$BIN/deepspeed" --num_gpus 1 examples/train_demo.py --steps 40 --print_every 10
TESTS=${GPU_CHECK_TESTS:-"tests/accelerators/test_accelerator_cuda.py tests/plugins/zero/test_zero_gpu.py
    tests/op_builder tests/core/optimizers/test_optimizer_behaviour.py
    tests/core/checkpoint/test_checkpoint_files.py tests/core/activation_checkpointing/test_ac_rng.py
    tests/plugins/zero/test_zero_nvme_swapper.py tests/plugins/sequence/test_sequence_offload.py
    tests/plugins/zero/test_zeropp_quantize.py tests/plugins/inference/test_inference_kernel_inject.py
    tests/plugins/sparse_attention/test_triton_kernels.py tests/core/ops/test_transformer_kernel.py
    tests/core/ops/test_evoformer_attention.py tests/core/comm/test_comm_host_staging.py"}
# shellcheck disable=SC2086  # the list is word-split on purpose
step tests 320 python3 -m pytest -q -rfs -p no:cacheprovider --timeout 200 --durations=15 $TESTS
step fused_adam_fp32 60 python3 tools/bench/fused_adam_bench.py --params 200 --numel 1000000 \
    --dtype fp32 --steps 30
step fused_adam_bf16 60 python3 tools/bench/fused_adam_bench.py --params 200 --numel 1000000 \
    --dtype bf16 --steps 30
step transformer_kernel 45 python3 tools/bench/transformer_kernel_bench.py
step evoformer 45 python3 tools/bench/evoformer_bench.py
step sparse_attention 60 python3 tools/bench/sparse_attention_bench.py --seqs 4096 16384
