"""Finding roster names in a question at a cost that does not grow with the roster.

A regex alternation over every name tries each name at each position of the text, and
compiling it for a 12,000-member channel takes seconds; one question's scan cost tens of
milliseconds. A name can only match where the text, with separators and case dropped
("squashed"), starts with the name's squashed form, so here the names are kept in a dict by
squashed form. At each word start of the text, the squashed prefixes are looked up, and
only the names found are tried there, one small pattern each (compiled once, cached), in
the alternation's order. The matches are the same as the full alternation's: same
positions, same groups, longest name first, no overlaps.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from speakermem.memory.search.cjk import LATIN_WORD_CHAR

SMALL = 64
"""Up to this many keys the full alternation is compiled once: filtering would not pay."""

PATTERN_CACHE = 4096
_SQUASH_RE = re.compile(r"[\s_.\-']+")
_WORD_CHAR = re.compile(LATIN_WORD_CHAR)


def squashed(text: str, fold: bool) -> str:
    """`text` without separators or apostrophes (and case-folded if `fold`)."""
    s = _SQUASH_RE.sub("", text)
    return s.casefold() if fold else s


def longest_first(key: str) -> tuple[int, str]:
    """Alternation order: a longer name wins over its own prefix at the same position."""
    return (-len(key), key)


def alternation(keys: Sequence[str], render: Callable[[str], str]) -> str:
    """One regex alternation of `keys`, each rendered by `render`, longest first."""
    return "|".join(render(k) for k in sorted(keys, key=longest_first))


class NameAlternation:
    """`finditer` of the pattern `template` with ``{alt}`` replaced by the alternation of
    `keys` (each rendered by `render`), without ever compiling the alternation of a large
    key set.
    """

    def __init__(
        self,
        keys: Sequence[str],
        template: str,
        render: Callable[[str], str],
        *,
        flags: int = 0,
    ) -> None:
        self.template = template
        self.render = render
        self.flags = flags
        self.fold = bool(flags & re.IGNORECASE)
        self.keys = tuple(keys)
        self._full: re.Pattern[str] | None = None
        if len(self.keys) <= SMALL:
            self._full = self._compile([*self.keys])
            return
        self._rank = {k: i for i, k in enumerate(sorted(self.keys, key=longest_first))}
        self._by_squash: dict[str, list[str]] = {}
        self._always: list[str] = []
        for k in self.keys:
            sq = squashed(k, self.fold)
            (self._by_squash.setdefault(sq, []) if sq else self._always).append(k)
        self._longest = max((len(s) for s in self._by_squash), default=0)
        self._patterns: OrderedDict[str, re.Pattern[str]] = OrderedDict()

    def _compile(self, keys: list[str]) -> re.Pattern[str]:
        return re.compile(
            self.template.replace("{alt}", alternation(keys, self.render)), self.flags
        )

    def _pattern(self, key: str) -> re.Pattern[str]:
        pattern = self._patterns.get(key)
        if pattern is None:
            pattern = self._patterns[key] = self._compile([key])
            while len(self._patterns) > PATTERN_CACHE:
                self._patterns.popitem(last=False)
        else:
            self._patterns.move_to_end(key)
        return pattern

    def _candidates_at(self, text: str, pos: int) -> list[str]:
        """Keys whose squashed form is a prefix of the squashed text from `pos` (after an
        optional '@')."""
        start = pos + 1 if text.startswith("@", pos) else pos
        window = text[start : start + self._longest * 4 + 8]
        sq = squashed(window, self.fold)[: self._longest]
        found = list(self._always)
        for n in range(1, len(sq) + 1):
            found.extend(self._by_squash.get(sq[:n], ()))
        return found

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if self._full is not None:
            yield from self._full.finditer(text)
            return
        pos = 0
        for start in range(len(text)):
            if start < pos or (start and _WORD_CHAR.match(text, start - 1)):
                continue
            cands = self._candidates_at(text, start)
            for key in sorted(cands, key=self._rank.__getitem__):
                m = self._pattern(key).match(text, start)
                if m is not None:
                    yield m
                    pos = m.end()
                    break
