"""The extractive answer's own words in the asker's language; the quotes stay verbatim.

Discord gives each interaction the user's locale ("zh-CN", "ja", "ko"), Slack each user
theirs ("ja-JP"); the adapters pass it down with the request. Only the framing is
translated (the lead-in, the nothing-found reply, the extractive notice): the cited
messages are quoted as they were written, and an LLM answers in the question's language on
its own. A locale without phrases here gets English.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class AnswerPhrases(BaseModel):
    """The framing of an extractive answer in one language."""

    model_config = ConfigDict(frozen=True)

    lead_in: str
    none_found: str
    notice: str
    """The extractive notice; `{why}` is replaced by the reason (empty when none is said)."""
    why: dict[str, str]
    """Why the answer is extractive, by `ExtractiveReason` (memory/query/answer.py)."""


ENGLISH = AnswerPhrases(
    lead_in="Here is what I found:",
    none_found="I have no record of that in the channels you can read.",
    notice="Extractive answer: quoted from the cited messages{why}.",
    why={
        "no_llm": "",
        "llm_failed": " (the language model is not answering right now)",
        "llm_empty": " (the language model gave an empty reply)",
        "uncited": " (the language model's reply cited none of them)",
    },
)

PHRASES: dict[str, AnswerPhrases] = {
    "en": ENGLISH,
    "zh-hans": AnswerPhrases(
        lead_in="我找到了这些：",
        none_found="在你能查看的频道里，我没有找到相关记录。",
        notice="摘录式回答：内容引自所列消息{why}。",
        why={
            "no_llm": "",
            "llm_failed": "（语言模型暂时没有响应）",
            "llm_empty": "（语言模型的回复为空）",
            "uncited": "（语言模型的回复没有引用任何消息）",
        },
    ),
    "zh-hant": AnswerPhrases(
        lead_in="我找到了這些：",
        none_found="在你能查看的頻道裡，我沒有找到相關記錄。",
        notice="摘錄式回答：內容引自所列訊息{why}。",
        why={
            "no_llm": "",
            "llm_failed": "（語言模型暫時沒有回應）",
            "llm_empty": "（語言模型的回覆為空）",
            "uncited": "（語言模型的回覆沒有引用任何訊息）",
        },
    ),
    "ja": AnswerPhrases(
        lead_in="見つかった内容です：",
        none_found="あなたが読めるチャンネルには、その記録がありません。",
        notice="抜粋による回答：引用元のメッセージをそのまま示しています{why}。",
        why={
            "no_llm": "",
            "llm_failed": "（言語モデルが現在応答していません）",
            "llm_empty": "（言語モデルの返答が空でした）",
            "uncited": "（言語モデルの返答に引用がありませんでした）",
        },
    ),
    "ko": AnswerPhrases(
        lead_in="찾은 내용입니다:",
        none_found="볼 수 있는 채널에서 관련 기록을 찾지 못했습니다.",
        notice="발췌 답변: 인용한 메시지를 그대로 보여 줍니다{why}.",
        why={
            "no_llm": "",
            "llm_failed": " (언어 모델이 지금 응답하지 않습니다)",
            "llm_empty": " (언어 모델의 답이 비어 있었습니다)",
            "uncited": " (언어 모델의 답에 인용이 없었습니다)",
        },
    ),
}

_TRADITIONAL = ("zh-tw", "zh-hk", "zh-mo", "zh-hant")


def phrases_for(locale: str | None) -> AnswerPhrases:
    """The phrases of a platform locale ("zh-CN", "zh_TW", "ja-JP", "ko"); English otherwise."""
    tag = (locale or "").strip().lower().replace("_", "-")
    if tag.startswith("zh"):
        return PHRASES["zh-hant" if tag.startswith(_TRADITIONAL) else "zh-hans"]
    return PHRASES.get(tag.split("-", 1)[0], ENGLISH)
