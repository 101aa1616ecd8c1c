#!/usr/bin/env bash
# Installs what is missing, builds m40-llm, and runs it on a shared model:
#
#   bash scripts/run-main.sh [MODEL.gguf]
#
# (default model: ../shared/models/TinyStories-656K-Q8_0.gguf). For now the
# main job is `m40-llm show`, which prints the model's metadata and tensors.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

bash scripts/setup.sh

model=${1:-$M40_SHARED_DIR/models/TinyStories-656K-Q8_0.gguf}
if [ $# -eq 0 ]; then m40_require_shared; fi
bin=$(m40_binary "$(m40_abs "$M40_BUILD_DIR")")

m40_log "m40-llm show $model"
"$bin" show "$model"
