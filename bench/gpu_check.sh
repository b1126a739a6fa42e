#!/usr/bin/env bash
# The GPU check on a machine with one NVIDIA GPU, from any directory (--out is read from it):
#   bash bench/gpu_check.sh [--time-limit 480] [--out bench/RESULTS-gpu.md]
# Its Python (python3, or $PYTHON) must hold a CUDA build of torch. autotune's other
# dependencies come from the README's set-up (pip install -e .), or, on a machine that reaches
# no package index, from the wheels in .whl/ (fetched elsewhere by bench/gpu_wheels.sh), which
# are installed into /tmp/autotune-site and nowhere else.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
if [ -d "$REPO/.whl" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/autotune-site "$REPO"/.whl/*.whl
    export PYTHONPATH="/tmp/autotune-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" "$REPO/bench/gpu_check.py" "$@"
