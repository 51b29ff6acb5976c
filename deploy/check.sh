#!/usr/bin/env bash
# The one check: format, lint, types, import contracts, the generated reference, the docs
# site, tests. Run from anywhere. --fast runs the fast test tier only (pytest -m "not slow
# and not e2e": the pre-commit hook's). The full run spreads the tests over pytest-xdist
# workers, one per core (SPEAKERMEM_TEST_WORKERS: a number, or 0 for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=()
WORKERS=(-n "${SPEAKERMEM_TEST_WORKERS:-auto}" --dist loadgroup)
if [[ "${1:-}" == "--fast" ]]; then
  TESTS=(-m "not slow and not e2e")
  WORKERS=()
elif [[ $# -gt 0 ]]; then
  echo "usage: bash deploy/check.sh [--fast]" >&2
  exit 2
fi
SITE="$(mktemp -d)"
trap 'kill "${MYPY:-}" 2>/dev/null || true; rm -rf "$SITE"' EXIT
echo "== ruff format --check"; ruff format --check .
echo "== ruff check";          ruff check .
echo "== import contracts";    lint-imports
echo "== reference";           python scripts/gen_reference.py --check
echo "== docs";                NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$SITE"
# mypy (about 45 s on a cold cache, one core) runs beside the tests; its report follows theirs
# and either failing fails the check
echo "== mypy, beside the tests"
mypy >"$SITE/mypy.log" 2>&1 &
MYPY=$!
echo "== pytest"
tests=0
python -m pytest ${WORKERS[@]+"${WORKERS[@]}"} ${TESTS[@]+"${TESTS[@]}"} || tests=$?
types=0
wait "$MYPY" || types=$?
echo "== mypy"
cat "$SITE/mypy.log"
if ((tests || types)); then
  echo "== check FAILED:$( ((tests)) && echo " pytest")$( ((types)) && echo " mypy")" >&2
  exit 1
fi
