"""Project's vocabulary: the word lists and keyword patterns of the deterministic rules.

Which words are filler in a question (dropped from the issue), which everyday words are
also given names (a person only when capitalised), and the patterns that make a question
about everyone, about the group, or about the past (SPEC §5.1). Data only: the rules that
use them are `memory.query.projection` (issue, rows, tense) and
`memory.query.project_grammar` (people and relations).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

APOSTROPHES = str.maketrans(
    {
        "\u2019": "'",
        "\u2018": "'",
        "\u02bc": "'",
        "\u0060": "'",
        "\u00b4": "'",
        "\uff07": "'",
        "\u2032": "'",
    }
)
"""Curly and look-alike apostrophes -> ASCII; one char to one char so offsets are kept."""

_STOPWORDS_TEXT = """
    what when where who whom whose why how which whether do does did done doing is are was
    were be been being am has have had having will would shall should can could may might
    must ought i me my mine myself we us our ours ourselves you your yours yourself he him
    his himself she her hers herself it its itself they them their theirs themselves this
    that these those there here a an the and or but nor so if then than as of at by for with
    about against between into through during to from in out on off over under again further
    once up down any some all both each every few more most other such no not only own same
    too very just also even ever really please s t don't didn't doesn't isn't wasn't aren't
    weren't hasn't haven't hadn't won't wouldn't can't couldn't shouldn't what's who's
    where's when's how's it's that's there's i'm i've i'd i'll you're we're they're he's
    she's let's tell told tells telling say said says saying think thinks thought thinking
    feel feels felt know knows knew mention mentioned mentions talk talked talks talking
    discuss discussed recall remember remind reminded anything something everything nothing
    thing things stuff kind sort like likes liked opinion opinions view views take thoughts
    feeling feelings believe believes believed reckon get gets got go goes going went ask
    asked asks reply replied respond responded message messaged everyone everybody anyone
    anybody someone somebody person people member members before used originally previously
    initially formerly anymore still earlier changed first currently now ago lately recently
    history according hear heard hears
"""
ISSUE_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
"""Question words, function words and filler: dropped from the issue."""

_NAME_LIKE_WORDS_TEXT = """
    will may june april august bill art mark grace hope joy faith rose rich frank guy pat
    sue ray jack dawn summer autumn iris lily ruby amber penny max sky crystal chase chip
    sunny team group bot admin everyone all
"""
NAME_LIKE_WORDS = frozenset(_NAME_LIKE_WORDS_TEXT.split())
"""Everyday English words that are also given names (modal verbs, months, virtues,
flowers, adjectives): as roster name tokens they only match when capitalised. The channel's
own usage adds more per channel (`name_keys` / `common`)."""

DROP_PHRASES = re.compile(
    r"\b(?:used?\s+to|at\s+first|no\s+longer|over\s+time|last\s+time|in\s+the\s+past"
    r"|all\s+of\s+(?:us|them|you)|each\s+of\s+(?:us|them|you)|tell\s+me|do\s+you\s+know"
    r"|can\s+you|could\s+you|would\s+you)\b",
    re.IGNORECASE,
)

ALL_RE = re.compile(
    r"\b(?:every\s?one|every\s?body|any\s?one|any\s?body|who\s+all"
    r"|all\s+of\s+(?:us|them|you)|all\s+(?:the\s+)?(?:members|participants|people|users)"
    r"|every\s+(?:single\s+)?(?:person|member|participant|user)"
    r"|each\b(?!\s+(?:time|day|week|month|year|morning|evening|night|session|meeting|sprint"
    r"|release|round|other|of\s+(?:the\s+)?(?:times|days|weeks|months)))"
    r")",
    re.IGNORECASE,
)
GROUP_RE = re.compile(
    r"\b(?:decid(?:e|ed|es|ing)|decisions?|teams?|groups?|consensus|agreed|agreement"
    r"|we\s+all|together|norms?|rules?|polic(?:y|ies)|conventions?|collectively"
    r"|as\s+a\s+whole)\b",
    re.IGNORECASE,
)
GROUP_IF_NOBODY_RE = re.compile(r"\b(?:plan(?:s|ned)?|we|our|us)\b", re.IGNORECASE)
TENSE_RE = re.compile(
    r"\b(?:before|used\s+to|chang(?:e|ed|es|ing)|originally|at\s+first|previous(?:ly)?"
    r"|history|historically|over\s+time|any\s?more|no\s+longer|still|first|last\s+time"
    r"|earlier|initially|formerly|former|prior|evolv(?:e|ed|ing)|switched|ever"
    r"|in\s+the\s+past|back\s+then|at\s+the\s+time|since"
    r"|did(?:n't)?\s+(?:§\d+§|\w+)\s+use\s+to)\b",
    re.IGNORECASE,
)
CURRENT_TIME_RE = re.compile(
    r"(?:(?:in|on|during)\s+)?(?:(?:earlier\s+)?today|tonight"
    r"|(?:earlier\s+)?this\s+(?:morning|afternoon|evening|week|weekend|month|year)"
    r"|the\s+current\s+(?:week|month|year)|recently|lately|of\s+late"
    r"|in\s+recent\s+(?:days|weeks))",
    re.IGNORECASE,
)
REFERENCE_ANCHOR = datetime(2100, 1, 6, 12, tzinfo=UTC)
"""Only used to find time phrases (not to resolve them): any far-future Wednesday will do."""

WORD_RE = re.compile(r"[^\W_](?:[\w.+#'&-]*[\w+#])?")
MENTION_RE = re.compile(r"<@!?(?P<id>[A-Za-z0-9_.-]{1,64})(?:\|[^<>]{0,100})?>")


def name_key(text: str) -> str:
    """Comparison form of a name: apostrophes unified, case-folded, whitespace collapsed."""
    return " ".join(text.translate(APOSTROPHES).casefold().split())
