#!/usr/bin/env bash
# The one check: format, lint, types, import contracts, the generated reference, the docs
# site, tests. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
echo "== ruff format --check"; ruff format --check .
echo "== ruff check";          ruff check .
echo "== import contracts";    lint-imports
echo "== mypy";                mypy
echo "== reference";           python scripts/gen_reference.py --check
echo "== docs";                NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$SITE"
echo "== pytest";              python -m pytest
