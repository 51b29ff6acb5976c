#!/usr/bin/env bash
# The install a user without a clone gets, end to end (what CI runs): build the sdist and the
# wheel, install the wheel into a fresh venv outside the work tree, add the embedding weights
# (`speakermem model install`), then run the demo from there. Catches package data left out
# of the wheel (templates, static files, SQL, the demo conversation).
#   bash deploy/wheel.sh            # PYTHON picks the interpreter that builds (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
if ! "$PY" -c "import build" 2>/dev/null; then  # an interpreter without `build`: a venv with it
  "$PY" -m venv "$OUT/build-venv"
  "$OUT/build-venv/bin/python" -m pip install --quiet --quiet build
  PY="$OUT/build-venv/bin/python"
fi
echo "== python -m build (sdist and wheel)"
"$PY" -m build --outdir "$OUT/dist" . >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
ls -l "$OUT/dist"
# every data file of the package (templates, static files, SQL, JSON) is in the wheel
"$PY" - "$OUT"/dist/speakermem-*.whl <<'PYCODE'
import sys, zipfile
from pathlib import Path
inside = set(zipfile.ZipFile(sys.argv[1]).namelist())
data = [
    str(p.relative_to("src"))
    for p in Path("src/speakermem").rglob("*")
    if p.is_file() and p.suffix not in (".py", ".pyc")
]
missing = sorted(d for d in data if d not in inside)
if missing:
    sys.exit(f"error: the wheel lacks package data: {missing}")
print(f"the wheel holds all {len(data)} data files of src/speakermem")
PYCODE
echo "== pip install the wheel into a fresh venv in $OUT"
"$PY" -m venv "$OUT/venv"
"$OUT/venv/bin/python" -m pip install --quiet --quiet "$OUT"/dist/speakermem-*.whl
"$OUT/venv/bin/speakermem" model install >/dev/null
cd "$OUT"  # nothing of the work tree is importable from here
"$OUT/venv/bin/speakermem" --version
"$OUT/venv/bin/python" -m speakermem --version
for generic in memory bot integrations; do
  if "$OUT/venv/bin/python" -c "import $generic" 2>/dev/null; then
    echo "error: the installed wheel put a top-level '$generic' package on the path" >&2
    exit 1
  fi
done
echo "== speakermem demo --no-input (from the installed wheel)"
"$OUT/venv/bin/speakermem" --db "$OUT/demo.db" demo --no-input | tee "$OUT/demo.txt"
grep -Eq "^Embeddings: sentence-transformers/all-MiniLM-L6-v2; [1-9]" "$OUT/demo.txt" \
  || { echo "error: the demo ran without dense search" >&2; exit 1; }
grep -q "^\[1\] " "$OUT/demo.txt" || { echo "error: the demo cited nothing" >&2; exit 1; }
echo "== the wheel installs and answers with citations"
