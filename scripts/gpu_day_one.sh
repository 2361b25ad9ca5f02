#!/usr/bin/env bash
# The one command for a GPU box: measures what `rcgrpo plan` assumes and writes DIR/calibration.json
# (scripts/gpu_day_one.py: the CUDA context, NCCL over every GPU, the engine's prefill and decode
# kernels, the update of a random-init Qwen2.5-7B padded and with shared prefixes; under 8 minutes
# on one H100, estimated). Then `rcgrpo plan --calibration DIR/calibration.json` plans with it.
#
#   scripts/gpu_day_one.sh --out cache/day-one           # on a GPU
#   scripts/gpu_day_one.sh --smoke --out cache/smoke     # the same steps on the CPU, tiny width
#
# The python: $PYTHON, else .venv/bin/python, else python3; its torch must see the GPU (`make gpu`
# gives one that does). It needs torch, transformers, peft, pyyaml and numpy: any of them missing
# is installed from PyPI at the versions pyproject.toml pins; nothing else is downloaded (the
# model is built from its config with random weights).
set -euo pipefail
cd "$(dirname "$0")/.."

out="" smoke=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:-}"; shift 2 || { echo "error: --out needs a folder" >&2; exit 2; } ;;
    --smoke) smoke="--smoke"; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (usage: scripts/gpu_day_one.sh [--smoke] --out DIR)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "error: --out DIR is required (where calibration.json goes)" >&2; exit 2; }

py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi

# the packages the probes import, from PyPI at pyproject.toml's pins when missing
missing=$("$py" - <<'EOF'
import importlib.util, re, tomllib
wanted = {"torch": "torch", "transformers": "transformers", "peft": "peft", "yaml": "pyyaml",
          "numpy": "numpy"}
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
pins = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in deps}
print(" ".join(pins.get(dist, dist) for mod, dist in wanted.items()
               if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "installing from PyPI: $missing"
  # shellcheck disable=SC2086  # one argument per requirement
  "$py" -m pip install -q $missing
fi

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" scripts/gpu_day_one.py $smoke --out "$out"
