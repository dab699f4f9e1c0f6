#!/usr/bin/env bash
# Issue 31's CUDA checks in one go (~8 minutes on an H100; the most wanted first), for a GPU host where walla and its dependencies
# import (`python3 -c "import walla.extract.run, walla.train.run"`), run from the repository root:
#
#     bash benchmarks/gpu_check.sh OUT_DIR TOKENIZER_DIR ARC_DATA_DIR
#
# TOKENIZER_DIR: the SmolLM2 tokenizer saved with save_pretrained (the benchmarks' random-weight models use
# it); ARC_DATA_DIR: the folder holding arc/ARC-Challenge-Dev.jsonl (REAL_DATA). Every step writes its log
# to OUT_DIR as it runs (tee, unbuffered), so a step stopped by a time limit keeps what it measured.
set -u
if ! nvidia-smi -L >/dev/null 2>&1; then  # a CPU machine: say so at once, before anything imports torch
    echo "gpu_check.sh: no CUDA GPU here (nvidia-smi -L lists none); run it on a GPU host" >&2
    exit 2
fi
OUT=${1:?OUT_DIR}
TOK=${2:?TOKENIZER_DIR}
export REAL_DATA=${3:?ARC_DATA_DIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# A host image with PYTHONDONTWRITEBYTECODE=1 and no bytecode for its site-packages makes every process
# compile the ~4,900 modules it imports (7.9 s a process on the H100 host); a user's install has bytecode.
# Write it once, under PYTHONPYCACHEPREFIX, before anything is timed (each log says how long imports took).
export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/walla-pycache}
T0=$SECONDS
python3 -c "import walla.extract.run, walla.train.run, transformers.models.llama.modeling_llama"
echo "bytecode written in $((SECONDS - T0)) s" | tee "$OUT/bytecode.log"
/usr/bin/time -f "import walla.extract.run: %e s" python3 -c "import walla.extract.run" 2>&1 | tee -a "$OUT/bytecode.log"
timeout 330 python3 benchmarks/extract_throughput.py --device cuda --model 8b --tokenizer "$TOK" \
    --loop-batch 64,128 --repeat 2 2>&1 | tee "$OUT/extract_8b.log"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/extract/test_gpu.py tests/train 2>&1 |
    tee "$OUT/gpu_tests.log"
timeout 90 python3 benchmarks/train_speed.py --device cuda --only-share --cli 2>&1 | tee "$OUT/train_speed.log"
timeout 60 python3 benchmarks/fixed_attention.py --device cuda 2>&1 | tee "$OUT/fixed_attention.log"
echo "gpu_check: done in $((SECONDS - T0)) s"
