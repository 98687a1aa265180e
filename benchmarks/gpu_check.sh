#!/usr/bin/env bash
# GPU check (issue 12): PyTorch's varlen kernel and the blog's comparison on one GPU, offline. Fails (non-zero exit)
# as soon as any check fails; everything it prints is also in $OUT/gpu_check.log.
#
# Checks, chosen with CHECKS (default: all three, in this order):
#   tests  pytest tests/test_cuda.py (varlen kernel vs per-segment SDPA: outputs, gradients, GQA, bf16 autocast,
#          windows, MLA; families on CUDA as on CPU; small-llama bursts padded vs flatten; memory per phase and by
#          NVML) and tests/test_torch_varlen.py (the installed varlen_attn's signature); then the family table on
#          this machine's transformers, as a report ($OUT/packing_exactness.md: an older transformers may refuse
#          families that requirements.txt's packs, and the table says which);
#   bench  llama-1b (Llama-3.2-1B shape, random init), bf16 autocast, AdamW, on flan-like and orcamath-like, padded
#          vs flatten with --attention varlen and sdpa (and flash_attention_2 when flash-attn imports); then
#          $OUT/gpu_check.md via benchmarks/gpu_report.py (tokens/s, speedup vs ideal, peak memory vs padded,
#          Δloss, memory estimate vs max_memory_allocated per category, the NVML-measured CUDA context);
#   app    `python app.py` and one /compare call through gradio_client (benchmarks/app_check.py).
#
# Packages the machine lacks come from carried wheels in .whl/ (wheel files or the .tar.xz sets that
# benchmarks/carried_wheels.py packs; see docs/GPU_OFFLINE.md), installed offline into .whl/site. Nothing is
# installed from the network. On the project's H200 (torch 2.11, transformers 5.17, Python 3.12) the sets do not fit
# one call's 64 MiB, so it takes two calls on the same warm machine:
#   CHECKS="tests bench" bash benchmarks/gpu_check.sh     carrying .whl/train.tar.xz   (~7 min)
#   CHECKS=app bash benchmarks/gpu_check.sh               carrying .whl/app.tar.xz     (~2 min)
# Usage: OUT=/some/dir CHECKS="tests bench app" bash benchmarks/gpu_check.sh   (STEPS, BATCH: the llama-1b run size)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_out}"
CHECKS="${CHECKS:-tests bench app}"
STEPS="${STEPS:-10}"  # step 1 is warm-up, step 2 profiled (time anatomy): 8 timed steps
BATCH="${BATCH:-8}"
BUDGET_S="${BUDGET_S:-480}"  # the llama-1b runs stop being started after this many seconds: a run that cannot finish
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false GRADIO_ANALYTICS_ENABLED=False
export PYTHONPATH="$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}"

need() {  # need SET MODULE...: stop, naming what to carry, when a module does not import
    local set="$1"
    shift
    python - "$set" "$@" <<'EOF'
import importlib.util, sys
missing = [name for name in sys.argv[2:] if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"FAILED: {', '.join(missing)} not importable: carry .whl/{sys.argv[1]}.tar.xz (docs/GPU_OFFLINE.md)")
EOF
}

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), checks: $CHECKS"
nvidia-smi
python benchmarks/carried_wheels.py install .whl .whl/site
python - <<'EOF'
import platform, torch, transformers
from demo_core.attention import kernels as torch_varlen
print(f"python {platform.python_version()}  torch {torch.__version__} (CUDA {torch.version.cuda})  "
      f"transformers {transformers.__version__}  GPU {torch.cuda.get_device_name()}")
print("varlen_attn:", torch_varlen.INSTALLED.describe() if torch_varlen.INSTALLED else torch_varlen.absence_reason())
EOF

for check in $CHECKS; do
    case "$check" in
    tests)
        echo "== tests (${SECONDS}s so far)"
        need train trl datasets accelerate pynvml pytest
        python -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_torch_varlen.py
        python benchmarks/packing_exactness.py | tee "$OUT/packing_exactness.md"
        ;;
    bench)
        need train trl datasets accelerate pynvml
        attentions="varlen sdpa"
        if python -c "import sys; from transformers.utils import is_flash_attn_2_available as f; sys.exit(not f())"; then
            attentions="$attentions flash_attention_2"
        fi
        rm -f "$OUT"/llama-1b-*.json
        for attention in $attentions; do
            for dataset in flan-like orcamath-like; do
                if (( SECONDS > BUDGET_S )); then
                    echo "FAILED: out of time before llama-1b $dataset $attention (${SECONDS}s of ${BUDGET_S}s)"
                    exit 1
                fi
                echo "== llama-1b $dataset $attention (${SECONDS}s so far)"
                python -m demo_core compare --model llama-1b --dataset "$dataset" --samples $((STEPS * BATCH)) \
                    --collators padded,flatten --steps "$STEPS" --batch-size "$BATCH" --max-length 1024 \
                    --attention "$attention" --precision bf16 --optimizer adamw --device cuda \
                    --json "$OUT/llama-1b-$dataset-$attention.json"
            done
        done
        python benchmarks/gpu_report.py "$OUT"
        ;;
    app)
        echo "== app (${SECONDS}s so far)"
        need train trl datasets accelerate
        need app gradio gradio_client matplotlib
        python benchmarks/app_check.py --model llama-1b --out "$OUT"
        ;;
    *)
        echo "unknown check '$check' (choose from: tests bench app)"
        exit 2
        ;;
    esac
done
echo "== all checks passed in ${SECONDS}s"
