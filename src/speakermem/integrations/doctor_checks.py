"""A `speakermem doctor` check, as every part of the doctor reports it (integrations/doctor.py,
integrations/doctor_llm.py): ok / warn / fail / skip, a detail, and a fix for anything not ok."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

Status = Literal["ok", "warn", "fail", "skip"]


class Check(BaseModel):
    area: str
    name: str
    status: Status
    detail: str = ""
    fix: str | None = None


def verdict(
    area: str, name: str, ok: bool, detail: str, fix: str, *, bad: Status = "fail"
) -> Check:
    """A check that passes or not: status "ok" or `bad`, and the fix only when it is not ok."""
    return Check(
        area=area, name=name, status="ok" if ok else bad, detail=detail, fix=None if ok else fix
    )


def exit_code(checks: Sequence[Check]) -> int:
    """1 when anything failed; warnings (e.g. no LLM configured) still exit 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0
