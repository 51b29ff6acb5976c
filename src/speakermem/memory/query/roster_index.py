"""The roster as Project reads it: every way a question may name a member, looked up fast.

Full display names and aliases name a member outright; the tokens of a display name (first or
last name) name them when nothing stronger does; a handle matches however it is typed
("night-owl" ~ "Night Owl" ~ "nightowl"). Everyday words that are also names (`NAME_LIKE_WORDS`,
or those the channel itself writes in lower case, `common`) only name someone when
capitalised. The index is built once per roster (`memory.roster_cache`) and the channel's
`common` words overlay it without a rebuild.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache

from speakermem.memory.models import RosterMember
from speakermem.memory.query.project_words import ISSUE_STOPWORDS, NAME_LIKE_WORDS, name_key
from speakermem.memory.roster_cache import derived
from speakermem.memory.search.cjk import LATIN_WORD_CHAR, romanised
from speakermem.memory.search.name_match import NameAlternation


@dataclass(frozen=True)
class RosterIndex:
    """A roster's names by comparison key (`name_key`), with the patterns that find them."""

    names: dict[str, str]
    """user id -> display name."""
    ids_fold: dict[str, str]
    strong: dict[str, frozenset[str]]
    """Full display names, aliases -> ids."""
    weak: dict[str, frozenset[str]]
    """Tokens of display names (first/last names) -> ids."""
    caps_only: frozenset[str]
    name_re: NameAlternation | None
    id_re: NameAlternation | None
    common: frozenset[str]
    """Name keys the channel uses as ordinary words: people only when capitalised mid-sentence."""
    squashed: dict[str, frozenset[str]]
    """Names without separators or case ('night-owl', 'Night Owl' -> 'nightowl') -> ids."""
    squash_keys: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Squashed form -> the name keys (long enough to squash) that give it."""

    def lookup(self, key: str) -> frozenset[str]:
        """Ids a name key refers to: full names and aliases win over name tokens, and an
        exact spelling over a handle written with other separators."""
        if key in self.strong:
            return self.strong[key]
        if key in self.weak:
            return self.weak[key]
        return self.squashed.get(squash(key), frozenset())


_SEPARATORS = re.compile(r"[\s_.\-]+")
_CHUNK_RE = re.compile(r"[^\W\d_]+|\d+|[^\w\s.\-]+", re.UNICODE)
_BRACKETS = re.compile(r"\s*[(\[{][^)\]}]*[)\]}]")


def squash(key: str) -> str:
    """A handle's comparison form: case, spaces, '_', '.', '-' and apostrophes ignored."""
    return _SEPARATORS.sub("", key.replace("'", ""))


def name_variants(name: str) -> set[str]:
    k = name_key(name).lstrip("@").strip()
    out = {k} if k else set()
    if "'" in k:
        out.add(k.replace("'", ""))
    return out


def key_pattern(key: str) -> str:
    """A name key as a regex where separators are optional and interchangeable, so a handle
    matches however it is typed: 'zed_42' ~ 'Zed 42', 'zed42'; 'night-owl' ~ 'Night Owl'."""
    chunks = _CHUNK_RE.findall(key)
    if len(chunks) <= 1 or "".join(chunks) != squash(key):
        return r"\s+".join(re.escape(part) for part in key.split(" "))
    return r"[\s_.\-]*".join(re.escape(c) for c in chunks)


@lru_cache(maxsize=64)
def build_index(
    sig: tuple[tuple[str, str, tuple[str, ...]], ...], common: frozenset[str] = frozenset()
) -> RosterIndex:
    names: dict[str, str] = {}
    strong: dict[str, set[str]] = {}
    weak: dict[str, set[str]] = {}
    for uid, display, aliases in sig:
        names.setdefault(uid, display)
        for n in (display, *aliases):
            for v in name_variants(n):
                strong.setdefault(v, set()).add(uid)
            # a CJK name also goes by its romanised form ("李伟" ~ "Li Wei", "LiWei")
            if (latin := romanised(n)) is not None:
                for v in name_variants(latin):
                    strong.setdefault(v, set()).add(uid)
        # A remark in brackets ("Carl (Dana's date)") describes the person; it is not
        # their name, so only the part before it gives name tokens (and a name by itself).
        bare = _BRACKETS.sub(" ", display).strip()
        if bare and bare != display.strip():
            for v in name_variants(bare):
                strong.setdefault(v, set()).add(uid)
        tokens = [t.strip('()[]{},.;:!?"') for t in name_key(bare or display).split()]
        if len(tokens) > 1:
            for tok in tokens:
                if len(tok) >= 2 and any(c.isalpha() for c in tok) and not tok.endswith("'s"):
                    for v in name_variants(tok):
                        weak.setdefault(v, set()).add(uid)
    weak = {k: v for k, v in weak.items() if k not in strong}
    keys = [k for k in (*strong, *weak) if len(k) >= 2 or not k.isascii()]
    caps_only = frozenset(
        k for k in keys if k in ISSUE_STOPWORDS or k in NAME_LIKE_WORDS or k in common
    )
    squashed: dict[str, set[str]] = {}
    squash_keys: dict[str, list[str]] = {}
    for k in keys:
        if len(squash(k)) >= 3:
            squash_keys.setdefault(squash(k), []).append(k)
            if k not in caps_only:
                squashed.setdefault(squash(k), set()).update(strong.get(k) or weak.get(k) or ())
    name_re = None
    if keys:
        name_re = NameAlternation(
            keys,
            # a word character next to the name makes it part of a longer word, unless it
            # is CJK (names sit inside CJK runs: "李伟说")
            rf"(?<!{LATIN_WORD_CHAR})(?<!['@])(?P<at>@)?(?P<name>{{alt}})(?P<poss>'s|s'|')?"
            rf"(?!{LATIN_WORD_CHAR})",
            key_pattern,
            flags=re.IGNORECASE,
        )
    # a raw id that reads as a lower-case word ("man", from a slugged name) is left to the
    # name rules: as an id it would match the word everywhere
    id_keys = [uid for uid in names if len(uid) >= 2 and not (uid.isalpha() and uid.islower())]
    id_re = None
    if id_keys:
        id_re = NameAlternation(
            id_keys, r"(?<![\w@<!])(?P<id>{alt})(?P<poss>'s)?(?!\w)", key_pattern
        )
    return RosterIndex(
        names=names,
        ids_fold={uid.casefold(): uid for uid in names},
        strong={k: frozenset(v) for k, v in strong.items()},
        weak={k: frozenset(v) for k, v in weak.items()},
        caps_only=caps_only,
        name_re=name_re,
        id_re=id_re,
        common=common,
        squashed={k: frozenset(v) for k, v in squashed.items()},
        squash_keys={k: tuple(v) for k, v in squash_keys.items()},
    )


_COMMON_INDEXES: OrderedDict[tuple[int, frozenset[str]], tuple[RosterIndex, RosterIndex]] = (
    OrderedDict()
)
_INDEX_CACHE = 64


def roster_index(roster: list[RosterMember], common: Collection[str] = frozenset()) -> RosterIndex:
    """The roster's index (built once per roster list), with the channel's `common` words
    overlaid: as lower-case words they are not names there."""
    base = derived(roster, "projection-index", _base_index)
    keys = frozenset(name_key(c) for c in common)
    return with_common(base, keys) if keys else base


def _base_index(roster: Sequence[RosterMember]) -> RosterIndex:
    sig = tuple((m.user_id, m.display_name, tuple(m.aliases)) for m in roster if m.user_id.strip())
    return build_index(sig)


def with_common(base: RosterIndex, common: frozenset[str]) -> RosterIndex:
    """`base` where the `common` name keys count as ordinary words: they join `caps_only`
    and leave the squashed handles. Only the entries those keys touch are recomputed."""
    cache_key = (id(base), common)
    hit = _COMMON_INDEXES.get(cache_key)
    if hit is not None and hit[0] is base:
        return hit[1]
    newly = {k for k in common if k in base.strong or k in base.weak}
    caps_only = base.caps_only | newly
    squashed = dict(base.squashed)
    for sq in {squash(k) for k in newly}:
        ids: set[str] = set()
        for k in base.squash_keys.get(sq, ()):
            if k not in caps_only:
                ids.update(base.strong.get(k) or base.weak.get(k) or ())
        if ids:
            squashed[sq] = frozenset(ids)
        else:
            squashed.pop(sq, None)
    idx = dataclasses.replace(base, caps_only=caps_only, common=common, squashed=squashed)
    _COMMON_INDEXES[cache_key] = (base, idx)
    while len(_COMMON_INDEXES) > _INDEX_CACHE:
        _COMMON_INDEXES.popitem(last=False)
    return idx
