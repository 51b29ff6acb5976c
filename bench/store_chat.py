"""The store benchmark's synthetic chat: seeded multi-party channels with a Zipf vocabulary
(so full-text search behaves as on real chat), 3-8 named speakers per channel and 3-40 words
per message, arriving interleaved across channels like live traffic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from benchlib.words import Sounds, pseudo_words

from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.search.stopwords import STOPWORDS

SOUNDS = Sounds(
    onsets=tuple(
        "b c d f g h j k l m n p r s t v w z br ch cl cr dr fl gr kr pl pr sh st th tr".split()
    ),
    vowels=tuple("a e i o u ai ea ee oo ou".split()),
    codas=("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng"),
    syllables=(1, 2, 2, 2, 3, 3),
)
FIRST_NAMES = (
    "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert "
    "Sybil Trent Uma Victor Walter Xena Yusuf Zoe Amara Bruno Chen Dmitri Esme Farah Goran "
    "Hana Ines Jonas Kenji Lena Mateo Nora Omar Priya Quinn Rosa Sami Tomas Ulla Vera Wen"
).split()
LAST_NAMES = "Ng Smith Okafor Rossi Kim Novak Silva Berg Patel Moreau Haas Lund Ortiz Sato".split()


class ChatGen:
    """Deterministic synthetic multi-party chat across `n_channels` channels."""

    def __init__(self, seed: int, n_channels: int, vocab: int = 4000) -> None:
        self.rng = np.random.default_rng(seed)
        rng = np.random.default_rng(seed + 1)
        words = pseudo_words(rng, vocab, SOUNDS, exclude=STOPWORDS)
        stop = sorted(w for w in STOPWORDS if w.isalpha())
        rng.shuffle(stop)
        # Zipf ranking: the top ranks are mostly function words (as in English), with a content
        # word every 4th rank, so the commonest content words occur in ~10-30% of messages.
        ranked: list[str] = []
        si, wi = 0, 0
        while si < len(stop):
            if len(ranked) % 4 == 3:
                ranked.append(words[wi])
                wi += 1
            else:
                ranked.append(stop[si])
                si += 1
        ranked.extend(words[wi:])
        self.vocab = np.array(ranked, dtype=object)
        self.content = words
        self.common_content = words[:12]
        ranks = np.arange(1, len(ranked) + 1, dtype=np.float64)
        p = 1.0 / (ranks + 2.7) ** 1.07
        self.p = p / p.sum()
        self.cdf = np.cumsum(self.p)
        self.n_channels = n_channels
        self.channels: list[ChannelSpec] = []
        for c in range(n_channels):
            n_spk = int(rng.integers(3, 9))
            names = rng.choice(len(FIRST_NAMES), size=n_spk, replace=False)
            speakers = [
                (f"u{c}_{j}", f"{FIRST_NAMES[n]} {LAST_NAMES[int(rng.integers(len(LAST_NAMES)))]}")
                for j, n in enumerate(names)
            ]
            weights = 1.0 / np.arange(1, n_spk + 1) ** 0.8
            topic = rng.choice(len(words), size=40, replace=False)
            self.channels.append(
                ChannelSpec(
                    scope=Scope(platform="discord", workspace="bench", channel=f"chan{c:03d}"),
                    speakers=speakers,
                    speaker_cdf=np.cumsum(weights / weights.sum()),
                    topic=[words[int(t)] for t in topic],
                )
            )
        self.clock = [datetime(2024, 1, 1, tzinfo=UTC).timestamp()] * n_channels
        self.counter = [0] * n_channels

    def _words(self, n: int) -> np.ndarray:
        return self.vocab[
            np.searchsorted(self.cdf, self.rng.random(n), side="right").clip(0, len(self.vocab) - 1)
        ]

    def events(self, n: int, *, channels: Sequence[int] | None = None) -> list[MessageEvent]:
        """`n` messages arriving interleaved across `channels` (uniformly random arrivals)."""
        chans = np.asarray(channels if channels is not None else range(self.n_channels))
        rng = self.rng
        which = chans[rng.integers(0, len(chans), size=n)]
        lengths = np.clip(np.rint(rng.lognormal(2.3, 0.6, size=n)), 3, 40).astype(np.int64)
        tokens = self._words(int(lengths.sum()))
        topical = rng.random(len(tokens)) < 0.12
        topic_pick = rng.integers(0, 40, size=len(tokens))
        gaps = rng.exponential(45.0, size=n)
        long_gap = rng.random(n) < 0.01
        gaps[long_gap] += 3600.0 * 3
        spk_u = rng.random(n)
        out: list[MessageEvent] = []
        pos = 0
        for i in range(n):
            c = int(which[i])
            spec = self.channels[c]
            ln = int(lengths[i])
            ws = tokens[pos : pos + ln].copy()
            for j in np.nonzero(topical[pos : pos + ln])[0]:
                ws[j] = spec.topic[int(topic_pick[pos + j])]
            pos += ln
            self.clock[c] += float(gaps[i])
            self.counter[c] += 1
            sid = int(np.searchsorted(spec.speaker_cdf, spk_u[i], side="right"))
            uid, name = spec.speakers[min(sid, len(spec.speakers) - 1)]
            text = " ".join(ws)
            out.append(
                MessageEvent(
                    scope=spec.scope,
                    message_id=f"{c}-{self.counter[c]}",
                    speaker_id=uid,
                    speaker_name=name,
                    text=text[0].upper() + text[1:],
                    ts=datetime.fromtimestamp(self.clock[c], UTC),
                )
            )
        return out

    def queries(self, n: int, *, channel: int | None = None) -> list[str]:
        """Search queries: 2-6 words, Zipf draws (stop-words and common words included) mixed
        with uniform content words and channel-topic words."""
        rng = self.rng
        out = []
        for _ in range(n):
            k = int(rng.integers(2, 7))
            terms: list[str] = []
            for _ in range(k):
                u = rng.random()
                if u < 0.45:
                    terms.append(str(self._words(1)[0]))
                elif u < 0.6:
                    terms.append(self.common_content[int(rng.integers(len(self.common_content)))])
                elif u < 0.8 and channel is not None:
                    terms.append(self.channels[channel].topic[int(rng.integers(40))])
                else:
                    terms.append(self.content[int(rng.integers(len(self.content)))])
            out.append(" ".join(terms))
        return out


@dataclass
class ChannelSpec:
    scope: Scope
    speakers: list[tuple[str, str]]
    speaker_cdf: np.ndarray
    topic: list[str]
