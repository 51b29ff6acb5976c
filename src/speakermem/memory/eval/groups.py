"""Margins per channel and per part of a dataset, with their spread.

A mean over all questions hides how a gain is made: a lead of 20 points can be five
channels at +40 and five at 0. The evaluation reports, for each part of a dataset (the
small and the larger SocialMemBench networks) and for each channel (a network), the
pipeline's evidence recall against the part's best control, and the spread of the
channels' margins (min, max, standard deviation). A constant fitted on a few channels
shows up as a wide spread. Pure: it reads scored results only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

CONTROLS = ("bm25", "bm25_speaker", "dense", "hybrid")


class Scored(Protocol):
    """One question's evidence recall per system, with where it came from."""

    @property
    def channel(self) -> str: ...

    @property
    def group(self) -> str | None: ...

    @property
    def category(self) -> str: ...

    def recall(self, system: str) -> float: ...


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def spread(margins: Sequence[float]) -> dict[str, float]:
    """Min, max, mean and (population) standard deviation of per-channel margins, in
    points."""
    if not margins:
        return {"min": 0.0, "max": 0.0, "mean": 0.0, "stdev": 0.0}
    return {
        "min": round(min(margins), 1),
        "max": round(max(margins), 1),
        "mean": round(_mean(margins), 1),
        "stdev": round(statistics.pstdev(margins), 1),
    }


def part_report(
    items: Sequence[Scored], systems: Sequence[str] = ("speakermem", *CONTROLS)
) -> dict[str, Any]:
    """One part's recall per system, best control and margin, per category and per
    channel (each channel's margin against the part's best control), and the spread."""
    means = {s: round(_mean([r.recall(s) for r in items]), 4) for s in systems}
    best = max(CONTROLS, key=lambda s: means.get(s, 0.0))
    by_cat: dict[str, list[Scored]] = defaultdict(list)
    by_channel: dict[str, list[Scored]] = defaultdict(list)
    for r in items:
        by_cat[r.category].append(r)
        by_channel[r.channel].append(r)

    def margin(rows: Sequence[Scored], against: str) -> float:
        return round(
            100
            * (
                _mean([r.recall("speakermem") for r in rows])
                - _mean([r.recall(against) for r in rows])
            ),
            1,
        )

    categories = {}
    for cat, rows in sorted(by_cat.items()):
        cat_best = max(CONTROLS, key=lambda s: _mean([r.recall(s) for r in rows]))
        categories[cat] = {
            "n": len(rows),
            "speakermem": round(_mean([r.recall("speakermem") for r in rows]), 4),
            "best_control": cat_best,
            "best_control_recall": round(_mean([r.recall(cat_best) for r in rows]), 4),
            "margin": margin(rows, cat_best),
        }
    channels = {
        ch: {
            "n": len(rows),
            "speakermem": round(_mean([r.recall("speakermem") for r in rows]), 4),
            best: round(_mean([r.recall(best) for r in rows]), 4),
            "margin": margin(rows, best),
        }
        for ch, rows in sorted(by_channel.items())
    }
    return {
        "questions": len(items),
        "recall": means,
        "best_control": best,
        "margin": margin(items, best),
        "by_category": categories,
        "by_channel": channels,
        "channel_spread": spread([c["margin"] for c in channels.values()]),
    }


def parts_report(items: Sequence[Scored]) -> dict[str, Any]:
    """`part_report` for each part of the dataset (questions without a part go under
    'all'), by part name."""
    parts: dict[str, list[Scored]] = defaultdict(list)
    for r in items:
        parts[r.group or "all"].append(r)
    return {name: part_report(rows) for name, rows in sorted(parts.items())}


def margins_by_channel(
    items: Sequence[Scored], recall_of: Callable[[Scored], float], best: Mapping[str, str]
) -> dict[str, float]:
    """Per channel, in points: `recall_of` (a variant of the pipeline) against the best
    control of the channel's part (`best`: part -> control)."""
    rows: dict[str, list[Scored]] = defaultdict(list)
    for r in items:
        rows[r.channel].append(r)
    return {
        ch: round(
            100
            * (
                _mean([recall_of(r) for r in rs])
                - _mean([r.recall(best[rs[0].group or "all"]) for r in rs])
            ),
            1,
        )
        for ch, rs in sorted(rows.items())
    }


def parts_markdown(report: Mapping[str, Any]) -> list[str]:
    """The per-part, per-channel, ablation and interleaved blocks of a report as Markdown
    (what `speakermem eval` prints after the overall tables)."""
    lines: list[str] = []
    for name, part in (report.get("parts") or {}).items():
        best = part["best_control"]
        lines += [
            "",
            f"### {report['dataset']} / {name}: {part['questions']} questions, "
            f"margin {part['margin']:+.1f} points over {best}",
            "",
            "| category | n | speakermem | best control | margin |",
            "|---|---|---|---|---|",
        ]
        for cat, c in part["by_category"].items():
            lines.append(
                f"| {cat} | {c['n']} | {c['speakermem']:.3f} | {c['best_control']} "
                f"{c['best_control_recall']:.3f} | {c['margin']:+.1f} |"
            )
        sp = part["channel_spread"]
        lines += [
            "",
            f"Per channel (margin over {best}; spread min {sp['min']:+.1f}, max {sp['max']:+.1f}, "
            f"stdev {sp['stdev']:.1f}):",
            "",
            "| channel | n | speakermem | " + best + " | margin |",
            "|---|---|---|---|---|",
        ]
        for ch, c in part["by_channel"].items():
            lines.append(
                f"| {ch} | {c['n']} | {c['speakermem']:.3f} | {c[best]:.3f} | {c['margin']:+.1f} |"
            )
    ablations = report.get("ablations") or {}
    if ablations:
        parts = sorted({p for a in ablations.values() for p in a["parts"]})
        lines += [
            "",
            "### Ablations: margin with / without each mechanism",
            "",
            "| mechanism | " + " | ".join(parts) + " |",
            "|---|" + "---|" * len(parts),
        ]
        for name, a in ablations.items():
            cells = [
                f"{a['parts'][p]['margin_with']:+.1f} / {a['parts'][p]['margin_without']:+.1f}"
                if p in a["parts"]
                else "-"
                for p in parts
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    mixed = report.get("interleaved")
    if mixed:
        lines += [
            "",
            f"### Interleaved: every network in one channel ({mixed['questions']} questions)",
            "",
            f"Margin {100 * mixed['margin_over_best_control']:+.1f} points over "
            f"{mixed['best_control']} (speakermem "
            f"{mixed['systems']['speakermem']['evidence_recall']:.3f}).",
        ]
        lines += parts_markdown({**mixed, "interleaved": None, "ablations": None})
    return lines
