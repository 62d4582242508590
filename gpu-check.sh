#!/usr/bin/env bash
# gpu-check.sh: the one prepared GPU check, run once on a machine with a CUDA device;
# it needs about 4 minutes of device time (each part has a hard timeout; at most ~9).
#
#   1. kvbench doctor --gpu: vllm, torch on CUDA and sim, each with contiguous-max,
#      contiguous-oracle (in whole blocks of 16) and paged, on a 2-layer Llama-3-8B shape, 96 requests,
#      128 MiB of fp16 KV; prints the per-cell table and the decomposition
#      (app/gpu_smoke.py). Records: $OUT/smoke.
#   2. the torch runner on CUDA end to end through the CLI: kvbench run on the
#      tiny preset, all five policies beside sim; prints kvbench's summary table and
#      writes the report. Records: $OUT/torch-cuda.
#   3. a CPU tier of KV in vLLM's engine (kv_offloading_size, its offloading connector for
#      real) beside no tier, with vllm-sched and sim on the same cells: steps, computed tokens
#      and tokens loaded from the tier per run. Records: $OUT/offload.
#
# Usage: ./gpu-check.sh    (PYTHON=... to choose the interpreter; OUT=... for the records,
#                           default a new temporary directory)
# Exit status: 0 when every part passes; otherwise the first non-zero part's status
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
echo "== 1/3 kvbench doctor --gpu   (records: $OUT/smoke)"
KVBENCH_SMOKE_OUT="$OUT/smoke" timeout 240 "$PY" -m kvbench.app.cli doctor --gpu
rc_smoke=$?
if [ "$rc_smoke" -eq 2 ]; then
  echo "gpu-check: no CUDA device here; nothing more to check ($((SECONDS - t0)) s)"
  exit 2
fi

echo
echo "== 2/3 kvbench run: torch on CUDA, tiny preset, five policies beside sim   (records: $OUT/torch-cuda)"
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
echo "== 3/3 kvbench run: a CPU tier (vLLM's native offloading) in the engine, beside no tier, sim and vllm-sched   (records: $OUT/offload)"
"$PY" -c "from pathlib import Path; from kvbench.app.gpu_smoke import write_model; print(write_model(Path('$OUT/offload-model')) / 'config.json')" > "$OUT/offload-model.txt"
cat > "$OUT/offload.toml" <<TOML
name = "offload-cuda"
[model]
config = "$(cat "$OUT/offload-model.txt")"
kv_dtype = "fp16"
[memory]
kv_budget = "16MiB"
max_model_len = 1024
[workload]
source = "uniform"
num_requests = 96
prompt_min = 256
prompt_max = 768
output_min = 16
output_max = 64
arrival = "batch"
prefix_groups = 4
prefix_len = 256
seed = 0
[scheduler]
max_num_seqs = 32
max_num_batched_tokens = 1024
[run]
device = "cuda"
[grid]
runner = ["vllm", "vllm-sched", "sim"]
policy = ["paged-prefix"]
cpu_offload = ["0", "64MiB"]
block_size = [16]
TOML
timeout 180 "$PY" -m kvbench.app.cli run "$OUT/offload.toml" --out "$OUT/offload"
rc_offload=$?
"$PY" - "$OUT/offload" <<'PYEOF' || true
import sys
from pathlib import Path
from kvbench.harness import store
d = Path(sys.argv[1])
runs, reqs = store.read_table(d, "runs"), store.read_table(d, "requests")
runs["cpu_hit_tokens"] = [reqs[reqs["run_id"] == r]["cpu_hit_tokens"].sum() for r in runs["run_id"]]
cols = ["runner", "cpu_offload_bytes", "status", "steps", "computed_tokens", "cpu_hit_tokens", "offload_rules", "error"]
print(runs.sort_values(["cpu_offload_bytes", "runner"])[cols].to_string(index=False))
PYEOF

echo
echo "gpu-check: doctor --gpu exit $rc_smoke, torch run exit $rc_run, offload run exit $rc_offload, $((SECONDS - t0)) s, records in $OUT"
if [ "$rc_smoke" -ne 0 ]; then exit "$rc_smoke"; fi
if [ "$rc_run" -ne 0 ]; then exit "$rc_run"; fi
exit "$rc_offload"
