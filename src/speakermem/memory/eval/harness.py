"""The evaluation harness: ingest a dataset, run /recall per question beside the controls.

Reports, in one run, evidence recall@k and all-evidence hit rate (overall and per
category) for the pipeline and four one-shot controls, System 2's evidence coverage,
token-F1 and LLM-judged accuracy when an LLM is configured, and per-stage latency.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speakermem.memory.config import RecallConfig
from speakermem.memory.datasets.common import Dataset, EvalQuestion
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.eval.answer_metrics import (
    JUDGE_SCHEMA,
    all_hit,
    evidence_recall,
    parse_judgement,
    render_judge_messages,
    token_f1,
)
from speakermem.memory.eval.answer_scoring import (
    RUBRIC_SCHEMA,
    AnswerScore,
    chosen_option,
    options_note,
    parse_rubric,
    render_rubric_messages,
    rubric_score,
    short_match,
)
from speakermem.memory.eval.controls import ChannelIndex, hybrid
from speakermem.memory.eval.groups import margins_by_channel, parts_markdown, parts_report
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import Scope
from speakermem.memory.ports import LLM, ChatMessage, LLMError
from speakermem.memory.query.people_rank import PEOPLE_WEIGHTS
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest

SYSTEMS = ("speakermem", "bm25", "bm25_speaker", "dense", "hybrid")
ABLATIONS: dict[str, dict[str, Any]] = {
    "people_rank": {"people_rank": False},
    "broad_session_cap": {"broad_session_cap": 0},
    "group_speaker_cap": {"group_speaker_cap": 0},
    "pair_ranking": {"relation_weight": 0.0},
    "reply_context": {"context_structure": False},
}
"""The group-chat mechanisms `--ablate` switches off one at a time (RecallConfig overrides)."""
CONTROL_DEPTH = 100
DIFFICULTY_ORDER = {"easy": 0, "medium": 1, "hard": 2}


@dataclass
class QuestionResult:
    question: EvalQuestion
    retrieved: dict[str, list[str]]
    coverage: list[str] = field(default_factory=list)
    s1_only: list[str] = field(default_factory=list)
    pack_messages: int = 0
    pack_tokens: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    answer: str | None = None
    f1: float | None = None
    judged: bool | None = None
    scored: AnswerScore | None = None
    """The answer scored by its format (memory.eval.answer_scoring)."""
    claims: dict[str, int] = field(default_factory=dict)
    """The answer's claim check (checked, dropped, rewritten, abstained)."""
    variants: dict[str, list[str]] = field(default_factory=dict)
    """The evidence of each ablation (a mechanism switched off), by ablation name."""


@dataclass(frozen=True)
class _Scored:
    """A result as `memory.eval.groups` reads it."""

    result: QuestionResult
    k: int

    @property
    def channel(self) -> str:
        return self.result.question.scope.channel

    @property
    def group(self) -> str | None:
        return self.result.question.group

    @property
    def category(self) -> str:
        return self.result.question.category

    def recall(self, system: str) -> float:
        q = self.result.question
        got = self.result.retrieved.get(system) or self.result.variants.get(system, [])
        return evidence_recall(set(q.evidence), got, self.k, any_of=q.any_of)


def _aggregate(
    results: list[QuestionResult],
    system: str,
    k: int,
    *,
    ids: Callable[[QuestionResult], list[str]],
) -> dict[str, Any]:
    def block(items: list[QuestionResult]) -> dict[str, Any]:
        if not items:
            return {"evidence_recall": 0.0, "all_hit": 0.0, "n": 0}
        rec = [
            evidence_recall(set(r.question.evidence), ids(r), k, any_of=r.question.any_of)
            for r in items
        ]
        hit = [
            all_hit(set(r.question.evidence), ids(r), k, any_of=r.question.any_of) for r in items
        ]
        return {
            "evidence_recall": round(statistics.fmean(rec), 4),
            "all_hit": round(statistics.fmean(hit), 4),
            "n": len(items),
        }

    out = block(results)
    by_cat: dict[str, list[QuestionResult]] = defaultdict(list)
    by_level: dict[str, list[QuestionResult]] = defaultdict(list)
    for r in results:
        by_cat[r.question.category].append(r)
        if r.question.difficulty:
            by_level[r.question.difficulty].append(r)
    out["by_category"] = {cat: block(items) for cat, items in sorted(by_cat.items())}
    if by_level:
        out["by_difficulty"] = {
            level: block(by_level[level])
            for level in sorted(by_level, key=lambda lv: (DIFFICULTY_ORDER.get(lv, 9), lv))
        }
    return out


class EvalHarness:
    def __init__(
        self,
        engine: MemoryEngine,
        pipeline: RecallPipeline,
        *,
        k: int,
        llm: LLM | None = None,
        ablations: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.engine = engine
        self.pipeline = pipeline
        self.k = k
        self.llm = llm
        self.ablations = ablations or {}
        self._variants = {
            name: RecallPipeline(engine, config=pipeline.cfg.model_copy(update=update))
            for name, update in self.ablations.items()
        }
        self._indexes: dict[Scope, ChannelIndex] = {}

    async def index(self, scope: Scope) -> ChannelIndex:
        if scope not in self._indexes:
            (pk,) = await self.engine.channel_pks([scope])
            corpus = await self.engine.store.messages.channel_corpus(pk)
            vectors_by_pk = await self.engine.store.messages.vectors([c[0] for c in corpus])
            vectors = None
            if vectors_by_pk and len(vectors_by_pk) == len(corpus):
                vectors = np.stack([vectors_by_pk[c[0]] for c in corpus])
            self._indexes[scope] = ChannelIndex.build([(c[1], c[2], c[3]) for c in corpus], vectors)
        return self._indexes[scope]

    async def prepare(self, dataset: Dataset) -> None:
        """Infer the interaction graph of every imported channel before the questions (a live
        bot does it as messages arrive; /recall only catches up on the newest)."""
        for scope in dataset.scopes:
            (pk,) = await self.engine.channel_pks([scope])
            names = interaction_names(await self.engine.members(scope))
            while await self.engine.store.interactions.update(pk, names, limit=20_000):
                pass

    async def run_question(self, q: EvalQuestion) -> QuestionResult:
        started = time.perf_counter()
        note = options_note(q.options) if q.answer_format == "multiple_choice" else None
        result = await self.pipeline.run(
            RecallRequest(
                question=q.question, scope=q.scope, answer_note=note if q.options else None
            ),
            answer=self.llm is not None,
        )
        total_ms = (time.perf_counter() - started) * 1000
        idx = await self.index(q.scope)
        qvec = await self.engine.embed_query(q.question)
        bm25 = idx.bm25(q.question, CONTROL_DEPTH)
        bm25_sp = idx.bm25_speaker_text(q.question, CONTROL_DEPTH)
        dense = idx.dense(qvec, CONTROL_DEPTH)
        s1 = result.pack.s1_message_ids()[: self.k]
        out = QuestionResult(
            question=q,
            retrieved={"speakermem": s1, "bm25": bm25, "bm25_speaker": bm25_sp, "dense": dense},
            coverage=result.pack.all_message_ids(),
            s1_only=s1,
            pack_messages=len(result.pack.all_message_ids()),
            pack_tokens=result.pack.tokens,
            latency_ms={**result.trace.latency_ms, "total": round(total_ms, 2)},
            tokens=dict(result.trace.tokens),
        )
        for name, variant in self._variants.items():
            res = await variant.run(RecallRequest(question=q.question, scope=q.scope), answer=False)
            out.variants[name] = res.pack.s1_message_ids()[: self.k]
        if self.llm is not None:
            out.answer = result.answer.text
            out.claims = dict(result.trace.claims)
            out.f1 = token_f1(result.answer.text, q.answer)
            out.scored = await self.score_answer(q, result.answer.text)
            if out.scored.method == "judge":
                out.judged = out.scored.correct
        return out

    async def score_answer(self, q: EvalQuestion, answer: str) -> AnswerScore:
        """Multiple choice by the option chosen; a short answer by normalised match, then
        the judge; a long-form answer by the rubric judge; anything else by the judge."""
        if q.answer_format == "multiple_choice" and q.options and q.correct_option:
            chosen = chosen_option(answer, q.options)
            return AnswerScore.binary("option", chosen == q.correct_option, chosen=chosen)
        matched = q.correct_option and short_match(answer, q.correct_option)
        if q.answer_format == "short_answer" and matched:
            return AnswerScore.binary("match", True)
        if q.answer_format == "long_form":
            data = await self._ask_judge(
                render_rubric_messages(q.question, q.answer, answer), RUBRIC_SCHEMA, "rubric"
            )
            return rubric_score(parse_rubric(data))
        data = await self._ask_judge(
            render_judge_messages(q.question, q.answer, answer), JUDGE_SCHEMA, "judge"
        )
        return AnswerScore.binary("judge", parse_judgement(data))

    async def _ask_judge(
        self, messages: list[dict[str, str]], schema: dict[str, Any], name: str
    ) -> dict[str, Any] | None:
        assert self.llm is not None
        try:
            res = await self.llm.complete_json(
                [ChatMessage(**m) for m in messages],
                schema,
                schema_name=name,
                max_tokens=512 if name == "rubric" else 128,
            )
        except LLMError:
            return None
        return res.data

    async def run(
        self,
        dataset: Dataset,
        *,
        limit: int | None = None,
        on_progress: Callable[[int], None] | None = None,
        with_s2: bool = False,
    ) -> dict[str, Any]:
        await self.prepare(dataset)
        questions = [q for q in dataset.questions if q.evidence]
        skipped = len(dataset.questions) - len(questions)
        if limit is not None:
            questions = questions[:limit]
        results: list[QuestionResult] = []
        for q in questions:
            results.append(await self.run_question(q))
            if on_progress:
                on_progress(1)
        return self.report(dataset.name, results, skipped=skipped, with_s2=with_s2)

    def report(
        self, name: str, results: list[QuestionResult], *, skipped: int, with_s2: bool
    ) -> dict[str, Any]:
        k = self.k
        systems: dict[str, Any] = {}
        for system in ("speakermem", "bm25", "bm25_speaker", "dense"):
            systems[system] = _aggregate(
                results,
                system,
                k,
                ids=lambda r, s=system: r.retrieved[s],  # type: ignore[misc]
            )
        better = (
            "bm25_speaker"
            if systems["bm25_speaker"]["evidence_recall"] > systems["bm25"]["evidence_recall"]
            else "bm25"
        )
        for r in results:
            r.retrieved["hybrid"] = hybrid(r.retrieved[better], r.retrieved["dense"], k=k)
        systems["hybrid"] = _aggregate(results, "hybrid", k, ids=lambda r: r.retrieved["hybrid"])
        systems["hybrid"]["lexical"] = better
        if with_s2:
            cov = _aggregate(results, "coverage", 10**6, ids=lambda r: r.coverage)
            systems["speakermem"]["evidence_coverage"] = cov["evidence_recall"]
            systems["speakermem"]["evidence_coverage_all_hit"] = cov["all_hit"]
            systems["speakermem"]["evidence_coverage_by_category"] = cov["by_category"]
            systems["speakermem"]["s1_only_coverage"] = systems["speakermem"]["evidence_recall"]
        systems["speakermem"]["pack_messages"] = (
            round(statistics.fmean(r.pack_messages for r in results), 2) if results else 0.0
        )
        stage_names = sorted({s for r in results for s in r.latency_ms})
        latency = (
            {
                s: {
                    "mean_ms": round(
                        statistics.fmean(r.latency_ms.get(s, 0.0) for r in results), 2
                    ),
                    "p95_ms": round(_p95([r.latency_ms.get(s, 0.0) for r in results]), 2),
                }
                for s in stage_names
            }
            if results
            else {}
        )
        token_names = sorted({t for r in results for t in r.tokens})
        tokens = (
            {
                t: round(statistics.fmean(r.tokens.get(t, 0) for r in results), 1)
                for t in token_names
            }
            if results
            else {}
        )
        best_control = max(
            (s for s in SYSTEMS if s != "speakermem"),
            key=lambda s: systems[s]["evidence_recall"],
        )
        report: dict[str, Any] = {
            "dataset": name,
            "k": k,
            "questions": len(results),
            "skipped_without_evidence": skipped,
            "systems": systems,
            "best_control": best_control,
            "margin_over_best_control": round(
                systems["speakermem"]["evidence_recall"] - systems[best_control]["evidence_recall"],
                4,
            ),
            "latency_per_question": latency,
            "mean_tokens_per_question": tokens,
            "mean_pack_tokens": round(statistics.fmean(r.pack_tokens for r in results), 1)
            if results
            else 0.0,
        }
        scored = [_Scored(r, k) for r in results]
        if len({r.question.scope for r in results}) > 1 or any(r.question.group for r in results):
            report["parts"] = parts_report(scored)
        if self.ablations and results:
            report["ablations"] = self._ablation_report(scored, report.get("parts") or {})
        if self.llm is not None and results:
            f1s = [r.f1 for r in results if r.f1 is not None]
            judged = [r.judged for r in results if r.judged is not None]
            report["answers"] = {
                "token_f1": round(statistics.fmean(f1s), 4) if f1s else None,
                "judge_accuracy": round(statistics.fmean(judged), 4) if judged else None,
                "judged": len(judged),
                **answer_accuracy(results),
                **claim_rates(results),
            }
        return report

    def _ablation_report(self, scored: list[_Scored], parts: dict[str, Any]) -> dict[str, Any]:
        """Per mechanism: the margin over each part's best control with it and without it,
        overall and per channel."""
        best = {name: part["best_control"] for name, part in parts.items()} or {"all": "dense"}
        # the pipeline's own margins and the controls do not depend on the ablation
        with_ = margins_by_channel(scored, lambda r: r.recall("speakermem"), best)
        rows_of = {part: [r for r in scored if (r.group or "all") == part] for part in best}
        base = {
            part: (
                statistics.fmean(r.recall("speakermem") for r in rows),
                statistics.fmean(r.recall(best[part]) for r in rows),
            )
            for part, rows in rows_of.items()
            if rows
        }
        out: dict[str, Any] = {}
        for name, update in self.ablations.items():
            without = margins_by_channel(scored, lambda r, n=name: r.recall(n), best)  # type: ignore[misc]
            by_part: dict[str, Any] = {}
            for part, (on, ctl) in base.items():
                off = statistics.fmean(r.recall(name) for r in rows_of[part])
                by_part[part] = {
                    "margin_with": round(100 * (on - ctl), 1),
                    "margin_without": round(100 * (off - ctl), 1),
                }
            out[name] = {
                "switched_off_by": update,
                "parts": by_part,
                "by_channel": {ch: {"with": with_[ch], "without": without[ch]} for ch in with_},
            }
        return out


def fitted_constants(cfg: RecallConfig) -> dict[str, Any]:
    """The group-chat constants fitted to data, as this run used them; each was chosen by
    leave-one-network-out (bench/quality/fit_people.py, whose record with the
    cross-validated margins is docs/benchmarks/socialmembench-fit.json)."""
    return {
        "people_weights": PEOPLE_WEIGHTS.as_dict(),
        "broad_session_cap": cfg.broad_session_cap,
        "group_speaker_cap": cfg.group_speaker_cap,
        "broad_lexical_weight": cfg.broad_lexical_weight,
    }


def _accuracy_block(items: list[QuestionResult]) -> dict[str, Any]:
    scored = [r.scored for r in items if r.scored is not None and r.scored.correct is not None]
    return {
        "accuracy": round(statistics.fmean(bool(s.correct) for s in scored), 4) if scored else None,
        "mean_score": round(statistics.fmean(s.score or 0.0 for s in scored), 4)
        if scored
        else None,
        "n": len(items),
        "unscored": len(items) - len(scored),
    }


def answer_accuracy(results: list[QuestionResult]) -> dict[str, Any]:
    """Answers scored by format (memory.eval.answer_scoring): accuracy (correct answers)
    and mean score (partial credit), overall, per answer format, per category, per
    difficulty; `mean_score_per_channel` averages the channels' own means (SocialMemBench's
    MeanN, one per network)."""
    out = _accuracy_block(results)
    groups: dict[str, dict[str, list[QuestionResult]]] = {
        "by_format": defaultdict(list),
        "by_category": defaultdict(list),
        "by_difficulty": defaultdict(list),
    }
    per_channel: dict[Scope, list[QuestionResult]] = defaultdict(list)
    methods: dict[str, int] = defaultdict(int)
    for r in results:
        groups["by_format"][r.question.answer_format or "free"].append(r)
        groups["by_category"][r.question.category].append(r)
        if r.question.difficulty:
            groups["by_difficulty"][r.question.difficulty].append(r)
        per_channel[r.question.scope].append(r)
        if r.scored is not None:
            methods[r.scored.method] += 1
    for name, by in groups.items():
        if by:
            out[name] = {key: _accuracy_block(items) for key, items in sorted(by.items())}
    means = []
    for items in per_channel.values():
        got = [r.scored.score for r in items if r.scored is not None and r.scored.score is not None]
        if got:
            means.append(statistics.fmean(got))
    out["mean_score_per_channel"] = round(statistics.fmean(means), 4) if means else None
    out["scored_by"] = dict(sorted(methods.items()))
    return out


def claim_rates(results: list[QuestionResult]) -> dict[str, Any]:
    """Claims of the LLM answers checked against their citations: how many were dropped,
    re-cited, and how many answers abstained because nothing supported was left."""
    checked = sum(r.claims.get("checked", 0) for r in results)
    with_check = [r for r in results if r.claims]
    return {
        "claims_checked": checked,
        "dropped_claim_rate": round(sum(r.claims.get("dropped", 0) for r in results) / checked, 4)
        if checked
        else None,
        "rewritten_claim_rate": round(
            sum(r.claims.get("rewritten", 0) for r in results) / checked, 4
        )
        if checked
        else None,
        "abstained": sum(r.claims.get("abstained", 0) for r in with_check),
    }


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _breakdown(report: dict[str, Any], key: str, title: str) -> list[str]:
    """One table: per system, recall (and all-hit) overall and per group of `key`."""
    systems = report["systems"]
    groups = sorted(
        {g for s in systems.values() for g in s.get(key, {})},
        key=lambda g: (DIFFICULTY_ORDER.get(g, 9), g),
    )
    head = f"| system | recall@{report['k']} | all-hit | n | " + " | ".join(
        f"{g} ({systems['speakermem'].get(key, {}).get(g, {}).get('n', 0)})" for g in groups
    )
    lines = [f"### {report['dataset']}: {title}", "", head + " |", "|" + "---|" * (4 + len(groups))]
    for name in SYSTEMS:
        s = systems[name]
        per = " | ".join(
            f"{s.get(key, {}).get(g, {}).get('evidence_recall', 0):.3f}" for g in groups
        )
        lines.append(
            f"| {name} | {s['evidence_recall']:.3f} | {s['all_hit']:.3f} | {s['n']} | {per} |"
        )
    return lines


def markdown_table(report: dict[str, Any]) -> str:
    """The report's headline numbers as Markdown tables (overall, per category, and per
    difficulty where the dataset grades its questions)."""
    systems = report["systems"]
    lines = _breakdown(report, "by_category", f"evidence recall@{report['k']} by category")
    if any(s.get("by_difficulty") for s in systems.values()):
        lines.append("")
        lines += _breakdown(report, "by_difficulty", f"evidence recall@{report['k']} by difficulty")
    sm = systems["speakermem"]
    lines.append("")
    lines.append(
        f"Best control: {report['best_control']}; margin "
        f"{report['margin_over_best_control'] * 100:+.1f} points. Mean pack tokens "
        f"{report['mean_pack_tokens']}, mean pack messages {sm.get('pack_messages')}."
    )
    if "evidence_coverage" in sm:
        lines.append(
            f"System 2 contribution: evidence coverage S1+S2 {sm['evidence_coverage']:.3f} vs "
            f"S1 only {sm['s1_only_coverage']:.3f}."
        )
    lines += parts_markdown(report)
    if "answers" in report:
        a = report["answers"]
        lines.append(
            f"Answers: accuracy {a.get('accuracy')}, mean score {a.get('mean_score')} "
            f"(scored by {a.get('scored_by')}), token-F1 {a['token_f1']}, judge accuracy "
            f"{a['judge_accuracy']}."
        )
        if a.get("claims_checked"):
            lines.append(
                f"Claims: {a['claims_checked']} checked, dropped rate {a['dropped_claim_rate']}, "
                f"re-cited rate {a['rewritten_claim_rate']}, {a['abstained']} answers abstained."
            )
    return "\n".join(lines)
