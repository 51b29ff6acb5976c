"""Compose: one typed evidence pack from both tracks, and its pure renderer.

Excerpts are numbered once ([1], [2], ...) whichever track brought them; rows list
records with owner, source, time and state, and the numbers of their supporting
excerpts, so the answer can cite any claim. The two tracks keep separate token budgets
(SPEC §5.4): when a track's rendered text would exceed its budget, its longest texts are
shortened first (water-filling), so every excerpt keeps its number and only wording is cut.
Only when even the shortest wording cannot fit (an ALL question over a large roster) are
the least important records left out: source-k extras first, then each row's later
records, never a row's first one. The rows may use what the excerpts leave unused of their
budget (never the other way round: System 1 evidence is never shortened for the rows).

The sum of the two budgets is a hard cap, whatever the data: if the pack still exceeds it
(texts are never cut below MIN_CLIP_CHARS, chains can be long, names can be long), whole
items are left out, least important first: records provided about someone else, then rows'
later records, older chain nodes, fallback messages, the last rows, and finally the last
System 1 excerpts. `EvidencePack.cut` says what was cut, for --explain.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from speakermem.memory.config import RecallConfig
from speakermem.memory.context_budget import approx_tokens
from speakermem.memory.identity import identities
from speakermem.memory.models import GROUP, Scope, StoredMessage
from speakermem.memory.prompt_quoting import quote_line
from speakermem.memory.query.system2 import Row, RowRecord

MAX_EXCERPT_CHARS = 600
MAX_RECORD_CHARS = 400
S1_BUDGET_TOKENS: int = RecallConfig.model_fields["s1_pack_tokens"].default
"""Verbatim evidence selected by System 1 (top-k excerpts)."""
S2_BUDGET_TOKENS: int = RecallConfig.model_fields["s2_pack_tokens"].default
"""Rows: record lines, the excerpts that support them, and empty rows' fallback messages."""
MIN_CLIP_CHARS = 80
"""Texts are never cut below this; past that, whole items are left out (see `enforce_cap`)."""
MAX_NAME_CHARS = 60
"""Speaker, owner and row names are shortened to this in the pack (display names are free text)."""


class Excerpt(BaseModel):
    n: int
    scope: Scope
    message_id: str
    thread_id: str | None
    speaker_id: str
    speaker: str
    time: datetime
    text: str
    track: str
    """'s1' (selected verbatim evidence) or 's2' (support for a record or an empty row)."""


class PackRecord(BaseModel):
    record_id: int
    layer: str
    content: str
    owner: str
    source: str
    time: datetime
    state: str
    excerpts: list[int] = Field(default_factory=list)
    source_id: str = ""
    """The source's platform user id (or GROUP): whose words the record reports."""
    from_ids: list[str] = Field(default_factory=list)
    via_source: bool = False


class PackRow(BaseModel):
    key: str
    label: str
    records: list[PackRecord] = Field(default_factory=list)
    fallback_excerpts: list[int] = Field(default_factory=list)

    @property
    def none(self) -> bool:
        return not self.records and not self.fallback_excerpts


class EvidencePack(BaseModel):
    question: str
    tense: str
    excerpts: list[Excerpt]
    rows: list[PackRow]
    tokens: int = 0
    cut: list[str] = Field(default_factory=list)
    """What was shortened or left out to keep within the budgets (empty when all fit)."""

    def excerpt(self, n: int) -> Excerpt | None:
        return self.excerpts[n - 1] if 0 < n <= len(self.excerpts) else None

    def s1_message_ids(self) -> list[str]:
        return [e.message_id for e in self.excerpts if e.track == "s1"]

    def all_message_ids(self) -> list[str]:
        """Verbatim ids plus every record's from_ids (the pack's evidence coverage)."""
        ids = dict.fromkeys(e.message_id for e in self.excerpts)
        for row in self.rows:
            for rec in row.records:
                ids.update(dict.fromkeys(rec.from_ids))
        return list(ids)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compose(
    question: str,
    tense: str,
    s1: Sequence[StoredMessage],
    rows: Sequence[Row],
    support: dict[str, StoredMessage],
    names: dict[str, str],
    *,
    s1_budget: int = S1_BUDGET_TOKENS,
    s2_budget: int = S2_BUDGET_TOKENS,
) -> EvidencePack:
    """Number S1 excerpts first, then S2 support; attach excerpt numbers to records.

    The rendered pack never exceeds `s1_budget + s2_budget` tokens (see `enforce_cap`).
    """
    cap = s1_budget + s2_budget
    s1_kept = list(s1)
    rows_kept = [_copy_row(r) for r in rows]
    cut: list[str] = []
    while True:
        pack = _compose_once(
            question, tense, s1_kept, rows_kept, support, names, s1_budget, s2_budget
        )
        if pack.tokens <= cap:
            break
        note = _cut_one(s1_kept, rows_kept)
        if note is None:  # pragma: no cover - an empty pack is far below the smallest cap
            break
        cut.append(note)
    pack.cut = pack.cut + _summarise(cut)
    return pack


def _copy_row(row: Row) -> Row:
    return Row(
        key=row.key,
        label=row.label,
        records=[RowRecord(rr.record, list(rr.chain), rr.via_source) for rr in row.records],
        fallback=list(row.fallback),
    )


def _cut_one(s1: list[StoredMessage], rows: list[Row]) -> str | None:
    """Leave out the least important item still in the pack; say what it was."""
    for row in reversed(rows):
        for i in range(len(row.records) - 1, -1, -1):
            if row.records[i].via_source:
                del row.records[i]
                return f"a record provided about someone else ({row.label})"
    for row in reversed(rows):
        if len(row.records) > 1:
            row.records.pop()
            return f"a lower-ranked record ({row.label})"
    for row in reversed(rows):
        for rr in row.records:
            if len(rr.chain) > 1:
                rr.chain.pop(0)
                return f"an older update of a record ({row.label})"
    for row in reversed(rows):
        if row.fallback:
            row.fallback.pop()
            return f"a fallback message ({row.label})"
    if rows:
        row = rows.pop()
        return f"the row {row.label}"
    if s1:
        msg = s1.pop()
        return f"excerpt {msg.message_id}"
    return None


def _summarise(cut: list[str]) -> list[str]:
    """'left out: 3 x a lower-ranked record (Alice)' lines, in the order they were cut."""
    counts: dict[str, int] = {}
    for note in cut:
        counts[note] = counts.get(note, 0) + 1
    return [f"left out {n} x {note}" if n > 1 else f"left out {note}" for note, n in counts.items()]


def _compose_once(
    question: str,
    tense: str,
    s1: Sequence[StoredMessage],
    rows: Sequence[Row],
    support: dict[str, StoredMessage],
    names: dict[str, str],
    s1_budget: int,
    s2_budget: int,
) -> EvidencePack:
    """One composition at the given inputs: trim rows, number excerpts, shorten texts."""
    total = s1_budget + s2_budget
    s1_chars = sum(
        _EXCERPT_LINE_CHARS
        + len(m.scope.channel)
        + len(m.speaker_name)
        + min(len(m.text), MAX_EXCERPT_CHARS)
        for m in s1
    )
    s2_budget += max(0, s1_budget - s1_chars // 4)
    n_records = sum(len(r.records) for r in rows)
    rows = _trim_rows(rows, {(m.scope, m.message_id) for m in s1}, support, names, s2_budget)
    dropped = n_records - sum(len(r.records) for r in rows)
    excerpts: list[Excerpt] = []
    index: dict[tuple[Scope, str], int] = {}
    written = [*s1, *support.values(), *(m for row in rows for m in row.fallback)]
    who = identities(names, ((m.speaker_id, m.speaker_name) for m in written))

    def add(msg: StoredMessage, track: str) -> int:
        key = (msg.scope, msg.message_id)
        if key not in index:
            excerpts.append(
                Excerpt(
                    n=len(excerpts) + 1,
                    scope=msg.scope,
                    message_id=msg.message_id,
                    thread_id=msg.thread_id,
                    speaker_id=msg.speaker_id,
                    speaker=_clip(who.author(msg.speaker_id, msg.speaker_name), MAX_NAME_CHARS),
                    time=msg.ts,
                    text=_clip(msg.text, MAX_EXCERPT_CHARS),
                    track=track,
                )
            )
            index[key] = len(excerpts)
        return index[key]

    for msg in s1:
        add(msg, "s1")
    pack_rows: list[PackRow] = []
    for row in rows:
        label = who.person(row.key) if row.key in names else row.label
        prow = PackRow(key=row.key, label=_clip(label, MAX_NAME_CHARS))
        for rr in row.records:
            for node in rr.chain:
                nums: list[int] = []
                for mid in node.from_ids:
                    found = support.get(f"{node.scope}|{mid}")
                    if found is not None:
                        key = (found.scope, found.message_id)
                        if key in index:
                            nums.append(index[key])
                # cite the latest supporting message even if S1 did not select it
                if not nums and node.from_ids:
                    latest = support.get(f"{node.scope}|{node.from_ids[-1]}")
                    if latest is not None:
                        nums.append(add(latest, "s2"))
                prow.records.append(
                    PackRecord(
                        record_id=node.id,
                        layer=node.layer.value,
                        content=_clip(node.content, MAX_RECORD_CHARS),
                        owner=_clip(who.person(node.owner), MAX_NAME_CHARS),
                        source=_clip(who.person(node.source), MAX_NAME_CHARS),
                        time=node.time,
                        state=node.state.value,
                        excerpts=sorted(set(nums)),
                        from_ids=list(node.from_ids),
                        via_source=rr.via_source,
                        source_id=node.source,
                    )
                )
        for msg in row.fallback:
            prow.fallback_excerpts.append(add(msg, "s2"))
        pack_rows.append(prow)
    pack = EvidencePack(question=question, tense=tense, excerpts=excerpts, rows=pack_rows)
    if dropped:
        pack.cut.append(f"left out {dropped} lower-ranked records to fit the rows' budget")
    pack.cut.extend(fit_budgets(pack, s1_budget, s2_budget, total))
    pack.tokens = approx_tokens(render_pack(pack))
    return pack


_RECORD_LINE_CHARS = 80
"""A record line without its content and names: '    * ... | profile; owner=; ...' etc."""
_HEADINGS_CHARS = 150
"""The pack's two headings, blank line and "(none)" (`render_pack`), with room to spare."""
_EXCERPT_LINE_CHARS = 30
"""An excerpt line without its text, speaker and channel: '[12] 2024-03-01 09:00 #: '."""


def _record_cost(
    rr: RowRecord,
    s1: set[tuple[Scope, str]],
    support: dict[str, StoredMessage],
    names: dict[str, str],
) -> int:
    """Characters a row record takes at the shortest wording, with its support excerpt."""
    chars = 0
    for node in rr.chain:
        chars += _RECORD_LINE_CHARS + min(len(node.content), MIN_CLIP_CHARS)
        chars += len(names.get(node.owner, node.owner)) + len(names.get(node.source, node.source))
        msg = support.get(f"{node.scope}|{node.from_ids[-1]}") if node.from_ids else None
        if msg is not None and (msg.scope, msg.message_id) not in s1:
            chars += _EXCERPT_LINE_CHARS + len(msg.scope.channel) + len(msg.speaker_name)
            chars += min(len(msg.text), MIN_CLIP_CHARS)
    return chars


def _trim_rows(
    rows: Sequence[Row],
    s1: set[tuple[Scope, str]],
    support: dict[str, StoredMessage],
    names: dict[str, str],
    budget: int,
) -> list[Row]:
    """Rows whose records fit the S2 budget at the shortest wording (usually all of them)."""
    room = budget * 4
    for row in rows:
        room -= len(row.label) + 8
        if not row.records and row.fallback:  # "(no derived record; see ...)" + excerpts
            room -= 50 + sum(
                _EXCERPT_LINE_CHARS
                + len(m.scope.channel)
                + len(m.speaker_name)
                + min(len(m.text), MIN_CLIP_CHARS)
                for m in row.fallback
            )
    # a row's first record always stays; then by rank within the row, source-k extras last
    order = sorted(
        (
            (rr.via_source, rank, i)
            for i, row in enumerate(rows)
            for rank, rr in enumerate(row.records)
        ),
    )
    keep: set[tuple[int, int]] = set()
    for _, rank, i in order:
        cost = _record_cost(rows[i].records[rank], s1, support, names)
        if rank == 0 or cost <= room:
            keep.add((i, rank))
            room -= cost
    if len(keep) == sum(len(r.records) for r in rows):
        return list(rows)
    return [
        Row(
            key=row.key,
            label=row.label,
            fallback=row.fallback,
            records=[rr for rank, rr in enumerate(row.records) if (i, rank) in keep],
        )
        for i, row in enumerate(rows)
    ]


def clip_level(lengths: Sequence[int], room: int) -> int | None:
    """The largest cap c with sum(min(length, c)) <= room, or None when all fit uncut.

    Water-filling: short texts are kept whole and only the longest ones are shortened.
    """
    if sum(lengths) <= room:
        return None
    ordered = sorted(lengths)
    used = 0
    for i, length in enumerate(ordered):
        left = len(ordered) - i
        if used + length * left > room:
            return max((room - used) // left, 0)
        used += length
    return None  # pragma: no cover - unreachable: the sum exceeds room


def _fit_track(texts: list[tuple[object, str]], fixed_chars: int, budget: int) -> int:
    """Cut the texts (object, attribute) so the track renders within `budget` tokens;
    returns how many were shortened."""
    lengths = [len(getattr(obj, attr)) for obj, attr in texts]
    cap = clip_level(lengths, budget * 4 - fixed_chars)
    if cap is None:
        return 0
    cap = max(cap, MIN_CLIP_CHARS)
    for obj, attr in texts:
        setattr(obj, attr, _clip(getattr(obj, attr), cap))
    return sum(length > cap for length in lengths)


def fit_budgets(
    pack: EvidencePack, s1_budget: int, s2_budget: int, total: int | None = None
) -> list[str]:
    """Apply the two tracks' independent budgets to a pack, in place; say what was cut.

    With `total`, the rows also get no more than what the excerpts and headings leave of it.
    """
    s1 = [e for e in pack.excerpts if e.track == "s1"]
    s2 = [e for e in pack.excerpts if e.track != "s1"]
    records = [rec for row in pack.rows for rec in row.records]
    s1_fixed = sum(len(_excerpt_line(e)) + 1 - len(e.text) for e in s1)
    s2_fixed = sum(len(_excerpt_line(e)) + 1 - len(e.text) for e in s2)
    s2_fixed += sum(len(line) + 1 for line in _row_lines(pack))
    s2_fixed -= sum(len(rec.content) for rec in records)
    notes: list[str] = []
    if n := _fit_track([(e, "text") for e in s1], s1_fixed, s1_budget):
        notes.append(f"shortened {n} excerpts to fit the excerpts' budget")
    texts: list[tuple[object, str]] = [(e, "text") for e in s2]
    texts += [(r, "content") for r in records]
    if total is not None:
        s1_chars = sum(len(_excerpt_line(e)) + 1 for e in s1) + _HEADINGS_CHARS
        s2_budget = min(s2_budget, (total * 4 - s1_chars) // 4)
    if n := _fit_track(texts, s2_fixed, s2_budget):
        notes.append(f"shortened {n} record or support texts to fit the rows' budget")
    return notes


def _when(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%d %H:%M")


def _excerpt_line(e: Excerpt) -> str:
    """One excerpt; its channel, speaker and text quoted (memory.prompt_quoting)."""
    return (
        f"[{e.n}] {_when(e.time)} #{quote_line(e.scope.channel)} {quote_line(e.speaker)}:"
        f" {quote_line(e.text)}"
    )


def render_pack(pack: EvidencePack) -> str:
    """The pack as prompt text: numbered excerpts, then the PERSON/GROUP rows."""
    lines = ["EXCERPTS (verbatim messages; cite as [n]):"]
    if not pack.excerpts:
        lines.append("(none)")
    for e in pack.excerpts:
        lines.append(_excerpt_line(e))
    lines.append("")
    mode = "full history, oldest first" if pack.tense == "full" else "current state"
    lines.append(f"MEMORY ROWS ({mode}; owner/source/time/state; [n] = supporting excerpt):")
    lines.extend(_row_lines(pack))
    return "\n".join(lines)


def _row_lines(pack: EvidencePack) -> list[str]:
    lines: list[str] = []
    for row in pack.rows:
        title = "GROUP" if row.key == GROUP else quote_line(row.label)
        lines.append(f"- {title}:")
        if row.none:
            lines.append("    (none)")
            continue
        for rec in row.records:
            cites = "".join(f"[{n}]" for n in rec.excerpts)
            via = " (provided about someone else)" if rec.via_source else ""
            lines.append(
                f"    * {quote_line(rec.content)} | {rec.layer}; owner={quote_line(rec.owner)};"
                f" source={quote_line(rec.source)}; {_when(rec.time)}; {rec.state}{via}"
                f" {cites}".rstrip()
            )
        if row.fallback_excerpts and not row.records:
            nums = "".join(f"[{n}]" for n in row.fallback_excerpts)
            lines.append(f"    (no derived record; see their messages {nums})")
    return lines
