"""How much of a channel a question spans: one exchange, or a pattern across it.

Most recall questions ask about one moment ("where did Dana say the van was?"): the answer
sits in one session, and System 1 concentrates its evidence there. Group-chat questions
often ask about something no single exchange holds:

- `person`: one person's habit, preference, attitude, role or relationship, inferred from
  how they behave over time ("what does Sam's behaviour suggest about...");
- `change`: how something changed ("did Maya's view on X change?"): the before and the after
  are in different sessions;
- `group`: everyone's position or who departs from a group norm ("does everyone..."): the
  evidence is spread over several speakers.

For these, concentrating on the best-matching session loses most of the evidence; the
pipeline spreads it instead (`memory.query.spread`). The classification is pure and
deterministic (same words, same answer), like Project's fallback: it reads the projection's
rows and people and a few general English cues, never a dataset's phrasing.
"""

from __future__ import annotations

import re
from typing import Literal

from speakermem.memory.query.projection import ALL, Projection

Breadth = Literal["one", "person", "change", "group"]

_CHANGE_RE = re.compile(
    r"\b(?:chang(?:e|ed|es|ing)(?=\s*(?:[?.!,;]|$|over|across|since|from|between|through"
    r"|during|after|before|at\s+all|recently|lately|later|in\s+(?:any|the|his|her|their|how)))"
    r"|(?:any|a|the)\s+(?:sign\s+of\s+(?:a\s+)?)?changes?\b"
    r"|shift(?:s|ed|ing)?|evolv(?:e|ed|es|ing)|turning\s+point"
    r"|over\s+time|over\s+the\s+(?:course|sessions?|conversations?|months|weeks|years)"
    r"|no\s+longer|any\s?more|from\s+the\s+(?:beginning|start)\s+to"
    r"|(?:became|become|becoming|grew|gotten)\s+(?:more|less)\b)",
    re.IGNORECASE,
)
"""How something changed: its earlier and later states are in different sessions."""

_PATTERN_RE = re.compile(
    r"\b(?:behaviou?rs?|pattern\s+of|habits?|habitually|tend(?:s|ed)?\s+to|tendency"
    r"|preferences?|attitudes?|stances?|roles?|approach\s+to|personality"
    r"|relationships?\s+(?:between|with)|dynamics?|history\s+between|get(?:s)?\s+along"
    r"|restrictions?|what\s+(?:kind|sort)\s+of\s+(?:person|people)"
    r"|(?:what|anything)\s+(?:can|could)\s+(?:you|we)\s+(?:tell|say|infer)"
    r"|(?:suggest|reveal)s?\s+about"
    r"|(?:across|throughout)\s+(?:the\s+|all\s+(?:the\s+)?)?(?:sessions?|conversations?|chats?)"
    r"|based\s+on\s+(?:the\s+)?(?:\w+\s+)?(?:conversations?|chats?|messages))",
    re.IGNORECASE,
)
"""A person's trait, habit or relationship: shown over many exchanges, not stated in one."""

_EVERYONE_RE = re.compile(
    r"(?:(?:^|[.?!;:,]\s*|\b(?:and|but|so)\s+)(?:do|does|did|has|have|had|would|will)\s+"
    r"(?:every\s?one|every\s?body)\b"
    r"|\b(?:every\s?one's|every\s?body's|every\s+(?:single\s+)?(?:member|person|participant)"
    r"|each\s+(?:member|person|participant|of\s+(?:us|them|you|the))"
    r"|all\s+(?:the\s+|of\s+the\s+)?(?:\w+\s+)?(?:members|participants)"
    r"|(?:whole|entire)\s+(?:group|team|family|club|channel)|norms?)\b)",
    re.IGNORECASE,
)
"""Everyone's position, or who departs from what the group usually does."""


def question_breadth(question: str, projection: Projection) -> Breadth:
    """`group` for everyone's positions (rows ALL, asked of everyone); `change` for how
    something changed; `person` for a named person's trait or relationship; else `one`."""
    if ALL in projection.rows and _EVERYONE_RE.search(question):
        return "group"
    named = [p for p in projection.speakers if p not in ("GROUP", ALL)]
    if _CHANGE_RE.search(question):
        return "change"
    if named and _PATTERN_RE.search(question):
        return "person"
    return "one"
