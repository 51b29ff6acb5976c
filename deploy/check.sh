#!/usr/bin/env bash
# The one check: format, lint, types, import contracts, tests. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ruff format --check"; ruff format --check .
echo "== ruff check";          ruff check .
echo "== import contracts";    lint-imports
echo "== mypy";                mypy
echo "== pytest";              python -m pytest
