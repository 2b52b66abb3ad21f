# Sourced by the GPU scripts: OUT and DEV, and on a GPU (DEV=cuda) the device's description and
# an editable install of this repository (the device machine has torch and triton, nothing else).
set -uo pipefail
OUT=${OUT:-out/gpu}
DEV=${DEV:-cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "$DEV" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
fi
