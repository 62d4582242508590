#!/usr/bin/env bash
# gpu-check.sh: the one prepared GPU check, run once on a machine with a CUDA device;
# it needs about 3 minutes of device time (each part has a hard timeout; at most ~6).
#
#   1. kvbench doctor --gpu: vllm, torch on CUDA and sim, each with contiguous-max,
#      contiguous-oracle (in whole blocks of 16) and paged, on a 2-layer Llama-3-8B shape, 96 requests,
#      128 MiB of fp16 KV; prints the per-cell table and the decomposition
#      (app/gpu_smoke.py). Records: $OUT/smoke.
#   2. the torch runner on CUDA end to end through the CLI: kvbench run on the
#      tiny preset, all five policies beside sim; prints kvbench's summary table and
#      writes the report. Records: $OUT/torch-cuda.
#
# Usage: ./gpu-check.sh    (PYTHON=... to choose the interpreter; OUT=... for the records,
#                           default a new temporary directory)
# Exit status: 0 when both parts pass; otherwise the first non-zero part's status
# (2: no CUDA device).
set -u
cd "$(dirname "$0")"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
t0=$SECONDS

echo "== environment"
"$PY" - <<'PYEOF' || { echo "gpu-check: torch does not import with $PY"; exit 2; }
import importlib.metadata as m, sys, torch
try:
    vllm = m.version("vllm")
except m.PackageNotFoundError:
    vllm = "not installed (the vllm cell will be skipped)"
dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  CUDA {torch.version.cuda}  vllm {vllm}  device {dev}")
PYEOF
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>/dev/null || true

echo
echo "== 1/2 kvbench doctor --gpu   (records: $OUT/smoke)"
KVBENCH_SMOKE_OUT="$OUT/smoke" timeout 240 "$PY" -m kvbench.app.cli doctor --gpu
rc_smoke=$?
if [ "$rc_smoke" -eq 2 ]; then
  echo "gpu-check: no CUDA device here; nothing more to check ($((SECONDS - t0)) s)"
  exit 2
fi

echo
echo "== 2/2 kvbench run: torch on CUDA, tiny preset, five policies beside sim   (records: $OUT/torch-cuda)"
cat > "$OUT/torch-cuda.toml" <<'TOML'
name = "torch-cuda"
[model]
preset = "tiny"
kv_dtype = "fp16"
[memory]
kv_budget = "1MiB"
max_model_len = 512
[workload]
source = "uniform"
num_requests = 64
prompt_min = 16
prompt_max = 256
output_min = 16
output_max = 192
arrival = "batch"
prefix_groups = 4
prefix_len = 32
seed = 0
[scheduler]
max_num_seqs = 64
max_num_batched_tokens = 1024
[run]
device = "cuda"
[grid]
runner = ["torch", "sim"]
policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix"]
block_size = [16]
TOML
timeout 120 "$PY" -m kvbench.app.cli run "$OUT/torch-cuda.toml" --out "$OUT/torch-cuda"
rc_run=$?
"$PY" - "$OUT/torch-cuda" <<'PYEOF' || true
import sys
from pathlib import Path
from kvbench.harness import store
runs = store.read_table(Path(sys.argv[1]), "runs")
cols = ["runner", "policy", "status", "device", "attention_backend", "steps", "wall_tokens_per_s",
        "mean_step_wall_s", "peak_kv_bytes_allocated"]
print(runs[runs["runner"] == "torch"][cols].to_string(index=False))
PYEOF

echo
echo "gpu-check: doctor --gpu exit $rc_smoke, torch run exit $rc_run, $((SECONDS - t0)) s, records in $OUT"
if [ "$rc_smoke" -ne 0 ]; then exit "$rc_smoke"; fi
exit "$rc_run"
