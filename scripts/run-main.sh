#!/usr/bin/env bash
# Installs what is missing, builds m40-llm, and runs it on a shared model:
#
#   bash scripts/run-main.sh [MODEL.gguf]
#
# (default model: ../shared/models/TinyStories-656K-Q8_0.gguf): `m40-llm show`
# describes the model, then `m40-llm run` writes a story from a prompt (on the
# GPU when there is one, else on the CPU) and prints its speed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

bash scripts/setup.sh

model=${1:-$M40_SHARED_DIR/models/TinyStories-656K-Q8_0.gguf}
if [ $# -eq 0 ]; then m40_require_shared; fi
bin=$(m40_binary "$(m40_abs "$M40_BUILD_DIR")")

m40_log "m40-llm show $model"
"$bin" show "$model"
m40_log "m40-llm run $model \"Once upon a time\" -n 64 --verbose"
"$bin" run "$model" "Once upon a time" -n 64 --seed 42 --verbose
