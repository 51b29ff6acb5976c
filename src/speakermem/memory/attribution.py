"""Who said it: the attribution rules every derived record must meet, by platform user id.

A record's source is who provided the information; the messages it cites are its only
evidence that they did. So a person-sourced record must cite at least one message that
person wrote (a self-report, source = owner, one of the owner's own), and a record sourced
from GROUP needs at least two distinct speakers among its cited messages. Names never
count: the rule reads speaker ids only, so a note that *mentions* Alice is no evidence of
what Alice said, and a display name borrowed from her proves nothing either.

Pure, and shared by the Writer's validation (memory/writer/validate.py) and the commit-time
check inside the commit's transaction (memory/store/policy.py), so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable

from speakermem.memory.models import GROUP

SOURCE_NOT_CITED = "source_not_cited"
"""A person-sourced record (source != owner) cites no message its source wrote."""
SELF_REPORT_NOT_CITED = "self_report_not_cited"
"""A self-report (source = owner) cites no message of the owner's."""
GROUP_ONE_SPEAKER = "group_one_speaker"
"""A GROUP-sourced record rests on fewer than two distinct speakers."""

GROUP_MIN_SPEAKERS = 2
"""Distinct speakers a GROUP-sourced record's cited messages must span."""

ATTRIBUTION_REASONS = (SOURCE_NOT_CITED, SELF_REPORT_NOT_CITED, GROUP_ONE_SPEAKER)


def attribution_refusal(*, source: str, owner: str, speakers: Iterable[str]) -> str | None:
    """Why a record with this source and owner may not rest on messages by `speakers`
    (their platform user ids, one per cited message); None when it may."""
    spoke = {s for s in speakers if s}
    if source == GROUP:
        return None if len(spoke) >= GROUP_MIN_SPEAKERS else GROUP_ONE_SPEAKER
    if source in spoke:
        return None
    return SELF_REPORT_NOT_CITED if source == owner else SOURCE_NOT_CITED
