#!/usr/bin/env bash
# Kernel measurements on a machine with an NVIDIA GPU (not a test): what a development
# session lent a GPU runs, in one call, to add measured rows under models/data/.
#
#   OUT=DIR bash tests/benchmarks/device_profile.sh [sweep] [deepbench-conv] ...
#
#   sweep           the built-in sweep (444 shapes), FP32 and bf16: for a GPU with no
#                   measurements yet (the H100's took 56 s and 29 s)
#   deepbench-conv  DeepBench's 90 convolution shapes, all three passes (270 kernels),
#                   FP32 and bf16: the shapes the DeepBench GPUs were measured on, so the
#                   new GPU's convolutions can be compared with theirs row for row
#
# Writes into $OUT (default ./profile-out): one CSV per run in the layout `planner kernels
# fit` reads, plus gpu.csv (nvidia-smi) and versions.txt (driver, CUDA, PyTorch, cuDNN),
# and prints each run's wall time. Needs PyTorch with CUDA beside the planner's
# dependencies; runs the checkout's planner (python3 -m planner) from the repository root.
# $PROFILE_ARGS is added to every `planner kernels profile` (a dry run on a CPU:
# PROFILE_ARGS="--device cpu --name cori-knl --max-kernels 3 --repeats 1").
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-profile-out}
mkdir -p "$out"
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(deepbench-conv)

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total \
    --format=csv > "$out/gpu.csv"
else
  echo "no nvidia-smi" > "$out/gpu.csv"
fi
python3 - > "$out/versions.txt" <<'EOF'
import torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "gpu", gpu)
EOF
cat "$out/gpu.csv" "$out/versions.txt"

profile() {  # NAME DTYPE [profile options...]
  local name=$1 dtype=$2
  shift 2
  local start=$SECONDS
  # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
  python3 -m planner kernels profile --dtype "$dtype" "$@" ${PROFILE_ARGS:-} \
    -o "$out/$name-$dtype.csv"
  echo "$name $dtype: $((SECONDS - start)) s"
}

for run in "${runs[@]}"; do
  case $run in
    sweep)
      profile sweep float32
      profile sweep bfloat16 ;;
    deepbench-conv)
      profile deepbench-conv float32 --shapes models/data/deepbench/deepbench_conv.csv
      profile deepbench-conv bfloat16 --shapes models/data/deepbench/deepbench_conv.csv ;;
    *)
      echo "device_profile.sh: unknown run '$run' (expected sweep or deepbench-conv)" >&2
      exit 2 ;;
  esac
done
