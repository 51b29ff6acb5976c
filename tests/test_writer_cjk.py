"""The Writer on Chinese, Japanese and Korean chats: a CJK record is content (not empty), its
words are grounded by the cited message's bigrams, and the head selection's BM25 sees them."""

from __future__ import annotations

from speakermem.memory.writer.gate import DEFAULT_LEXICAL_THRESHOLD, EvidenceGate
from speakermem.memory.writer.validate import RejectReason, normalize_content
from tests.test_writer_validate import add, make_ctx, msg, reasons, validate_actions

CJK_SEGMENT = {
    "m1": msg(1, "U2", "Bob", "我们下周五发布新版本，大家准备好"),
    "m2": msg(2, "U1", "Alice", "今天中午吃饺子"),
}


def run(*items: dict) -> object:
    return validate_actions({"actions": list(items)}, make_ctx(ref_map=CJK_SEGMENT))


def test_a_grounded_chinese_record_is_accepted_and_a_swapped_one_is_not() -> None:
    ok = run(add(content="Bob说下周五发布新版本", refs=["m1"]))
    assert reasons(ok) == []  # type: ignore[arg-type]
    # Alice's own lunch message cited for the release: attributed right, not grounded
    swapped = run(add(content="Alice说下周五发布新版本", source="U1", owner="U1", refs=["m2"]))
    assert reasons(swapped) == [RejectReason.UNGROUNDED]  # type: ignore[arg-type]


def test_cjk_content_is_content_and_compares_by_its_text() -> None:
    assert normalize_content("发布新版本！") == "发布新版本"
    assert normalize_content("リリース は 来週") == "リリース は 来週"
    assert normalize_content("Hello, World") == "hello world"


def test_the_gate_counts_cjk_bigrams() -> None:
    gate = EvidenceGate()
    support, missing = gate.lexical_support("발표는 금요일", ["발표는 다음 주 금요일이에요"])
    assert support == 1.0 and missing == ()
    support, _ = gate.lexical_support("리허설은 토요일", ["발표는 다음 주 금요일이에요"])
    assert support < DEFAULT_LEXICAL_THRESHOLD  # only 요일 is shared
