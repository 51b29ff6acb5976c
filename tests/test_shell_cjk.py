"""`speakermem shell` and `speakermem search` in Chinese, Japanese and Korean, end to end:
people post in the shell, lexical search finds words inside their messages, and a Japanese
question recalls the Japanese message about it first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ENV = {"SPEAKERMEM_EMBEDDER": "none", "SPEAKERMEM_LLM_BASE_URL": ""}
SCRIPT = """\
/as li
我们下周五发布新版本
/as wang
发布计划我已经更新了
/as sato
リリースは来週の金曜日です
/as minjun
릴리스는 다음 주 금요일이에요
/as dana
lunch at noon?
/recall リリースはいつ？
"""


def cli(db: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "speakermem.integrations.cli.main", "--db", str(db), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=120,
        cwd=db.parent,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_shell_posts_in_cjk_are_found_by_lexical_search_and_recall(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    out = cli(db, "shell", stdin=SCRIPT)
    answer = out.split("/recall リリースはいつ？", 1)[1]
    first = re.search(r"^\[1\] (\w+) · #general", answer, re.M)
    assert first is not None and first.group(1) == "Sato", answer
    assert "リリースは来週の金曜日です" in answer  # quoted verbatim

    def lexical(word: str) -> list[str]:
        rows = json.loads(
            cli(db, "search", "--channel", "general", "--mode", "lexical", "--json", word)
        )
        return [r["speaker"] for r in rows]

    assert sorted(lexical("发布")) == ["Li", "Wang"]
    # every bigram of a longer word matches in Li's message, one character (新) in Wang's
    assert lexical("新版本")[0] == "Li"
    assert lexical("リリース") == ["Sato"]
    assert lexical("金曜日") == ["Sato"]
    assert lexical("릴리스") == ["Minjun"]
    assert lexical("lunch") == ["Dana"]
