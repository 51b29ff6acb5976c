#!/usr/bin/env bash
# Quickstart, first command: install SpeakerMem into ./.venv (runtime only), then run the demo
# (the shipped conversation, three cited /recall answers) and open the shell. Needs only
# Python >= 3.11; no token, no GPU.
#   bash deploy/demo.sh                 # demo, then the shell
#   bash deploy/demo.sh --no-input      # demo only (what CI runs)
# Extra arguments go to `speakermem demo` (e.g. --db PATH). SPEAKERMEM_VENV picks the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPEAKERMEM_VENV:-.venv}"
SPEAKERMEM_VENV="$VENV" bash deploy/install.sh
exec "$VENV/bin/speakermem" demo "$@"
