#!/usr/bin/env bash
# A session's GPU checks in one call of the device machine (torch, transformers there; no gradio, plotly, gguf):
#   bash scripts/gpu_check.sh TOKENIZER_DIR      (writes under $OUT, or /tmp/gpu-check; WITH_7B=0 skips 7B)
# 1. the engine's execution paths on CUDA (tests/test_exec_paths.py: chi-squared exactness, greedy equality,
#    static-cache rollback, eager and CUDA graphs); 2. the app's own path, loads and races through
#    serving.service (scripts/gpu_service.py); 3. the timings of random models from the real configurations
#    (specviz.hardware.gpu_report: 0.5B and 1.5B with the engine end to end, then 7B); 4. runs repeated must give
#    the same tokens (scripts/gpu_repeat.py).
# Packages the machine lacks (pydantic, platformdirs) travel as wheels in .whl/ or $WHL (see docs/executions.md, "On a GPU").
set -o pipefail
TOK=${1:?tokenizer directory}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
WHL=${WHL:-.whl}  # wheels for several Pythons: pip picks this machine's (pydantic_core is compiled)
if [ -d "$WHL" ]; then python3 -m pip install -q --no-index --find-links "$WHL" --no-compile --no-cache-dir --target /tmp/site \
  pydantic platformdirs $(python3 -c "import pytest" 2>/dev/null || echo pytest) && export PYTHONPATH=/tmp/site || exit 1; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
echo "== tests"; SECONDS=0
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="-ra" tests/test_exec_paths.py 2>&1 | tee "$OUT/tests.log" | tail -15
echo "tests: ${SECONDS}s"; echo "== service"; SECONDS=0
timeout 150 python3 scripts/gpu_service.py --real "$TOK" --out "$OUT/service.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/service.log" | cut -c1-900
echo "service: ${SECONDS}s"; echo "== report"; SECONDS=0
timeout 200 python3 -m specviz.hardware.gpu_report --sizes 0.5B,1.5B --engine "$TOK" --out "$OUT/report.json" 2>&1 | tee "$OUT/report.log" | grep -v "Loading weights"
echo "report: ${SECONDS}s"; echo "== repeatable runs"; SECONDS=0
timeout 90 python3 scripts/gpu_repeat.py "$TOK" 2>&1 | grep -v "Loading weights" | tee "$OUT/repeat.log"
echo "repeat: ${SECONDS}s"; SECONDS=0
[ "${WITH_7B:-1}" = 1 ] && timeout 120 python3 -m specviz.hardware.gpu_report --sizes 7B --out "$OUT/report7b.json" 2>&1 | tee "$OUT/report7b.log"
echo "report 7B: ${SECONDS}s"
