#!/usr/bin/env bash
# Quickstart, second command, and exactly what .ci/run calls: install everything (with the
# dev tools) into a fresh venv, then run the one check (deploy/check.sh: format, lint, import
# contracts, types, tests). SPEAKERMEM_TEST_VENV picks the venv (default ./.ci-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPEAKERMEM_TEST_VENV:-.ci-venv}"
rm -rf "$VENV"
SPEAKERMEM_VENV="$VENV" bash deploy/install.sh --dev
# shellcheck disable=SC1091
source "$VENV/bin/activate"
bash deploy/check.sh
