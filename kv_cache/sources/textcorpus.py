"""Text for semantic traffic: a built-in corpus of generated documents, or ShareGPT conversations.

Vocabulary: a *source* is one document (evidence paragraphs, one fact, one
question about it). The built-in corpus follows SemBench's synthetic
profile: three domains (support tickets, contract reviews, log triage), a
per-source tag roughly every 10 words so that no block-sized run of tokens is
shared between two sources by accident, and lengths in bands of 1/8, 1/4,
1/2, 3/4 and all of the maximum (weights 1/2/3/3/3: long documents are where
semantic reuse pays). A source's text depends on its id only, so it is the
same in every run and process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DOMAINS = ("support_ticket", "contract_review", "log_triage")
_LEXICON = {
    "support_ticket": (
        "customer agent ticket account password login session invoice refund device router firmware upgrade "
        "subscription portal browser cache token outage callback escalation queue mailbox license profile "
        "dashboard notification billing address phone plan",
        "reported escalated reset restored confirmed requested cancelled reinstalled verified updated blocked "
        "migrated synchronised refunded forwarded",
        "intermittent urgent expired duplicate slow corrupted pending temporary regional premium legacy "
        "unexpected"),
    "contract_review": (
        "clause party supplier licensee term renewal indemnity liability warranty notice payment invoice "
        "territory schedule amendment breach remedy audit confidentiality assignment termination fee deposit "
        "obligation exhibit counterparty jurisdiction arbitration insurance milestone",
        "governs limits excludes requires permits survives terminates assigns waives caps extends obliges "
        "restricts indemnifies",
        "material exclusive mutual annual written prior reasonable aggregate binding perpetual non-refundable "
        "statutory"),
    "log_triage": (
        "node service kernel thread request latency timeout heartbeat replica shard checkpoint scheduler "
        "container volume socket handler gateway worker queue retry disk partition lease leader follower "
        "snapshot deadline quota controller pod cluster",
        "failed restarted evicted throttled recovered stalled drained retried elected dropped flushed "
        "rotated compacted leaked",
        "transient fatal degraded stale orphaned saturated partial cascading periodic noisy spurious "
        "unhealthy"),
}
_GLUE = ("the", "a", "after", "before", "while", "because", "and", "then", "with", "without", "during", "for",
         "on", "in", "by", "from", "this", "each")
_BANDS, _BAND_WEIGHTS = (0.125, 0.25, 0.5, 0.75, 1.0), np.array([1, 2, 3, 3, 3]) / 12
_TOKENS_PER_WORD = 1.6  # generated prose with tags (cl100k: 1.4-1.55); only sets the word target


@dataclass(frozen=True)
class Document:
    """One source: paragraphs of evidence, a fact stated in them and a question about it."""

    source: int
    domain: str
    paragraphs: tuple[str, ...]
    question: str

    @property
    def context(self) -> str:
        return "\n\n".join(self.paragraphs)


class TextCorpus:
    """The built-in corpus: document(source) is generated from the source id alone."""

    name = "built-in corpus"

    def __init__(self, doc_tokens: tuple[int, int]):
        self.lo, self.hi = doc_tokens
        self._words = {d: tuple(tuple(part.split()) for part in _LEXICON[d]) for d in DOMAINS}

    def domain_of(self, source: int) -> int:
        return int(np.random.default_rng([0xD0, source]).integers(len(DOMAINS)))

    def unrelated(self, source: int) -> int:
        """A source of another domain, never drawn as anyone's own (SemBench's cross-domain control)."""
        other = source | (1 << 62)
        while self.domain_of(other) == self.domain_of(source):
            other += 1 << 48
        return other

    def document(self, source: int) -> Document:
        rng = np.random.default_rng([0x7E57, source])
        domain = DOMAINS[self.domain_of(source)]
        tag = f"[{source * 0x9E3779B1 % (1 << 24):06x}]"
        band = _BANDS[int(rng.choice(len(_BANDS), p=_BAND_WEIGHTS))]
        target = max(self.lo, int(self.hi * band)) / _TOKENS_PER_WORD
        nouns, verbs, adjs = self._words[domain]
        value = int(rng.integers(1000, 9999))
        fact = f"The reference value recorded for case {tag} is {value}."
        paragraphs, words, since_tag = [], 0, 0
        fact_at = int(rng.integers(0, 4))
        while words < target:
            sentences = []
            for _ in range(int(rng.integers(4, 8))):
                n = int(rng.integers(9, 17))
                pick = rng.integers(0, 1 << 30, n)
                out = []
                for i, r in enumerate(pick):
                    kind = i % 4
                    pool = _GLUE if kind == 0 else nouns if kind in (1, 3) else verbs if r & 1 else adjs
                    out.append(pool[int(r >> 1) % len(pool)])
                    since_tag += 1
                    if since_tag >= 10:  # the per-source tag: no 10-word run is shared between sources
                        out.append(tag)
                        since_tag = 0
                words += len(out)
                sentences.append(" ".join(out).capitalize() + ".")
            if len(paragraphs) == fact_at:
                sentences.append(fact)
            paragraphs.append(" ".join(sentences))
        question = f"What is the reference value recorded for case {tag}, and which {nouns[value % len(nouns)]} " \
                   f"does the evidence say was affected?"
        return Document(source, domain, tuple(paragraphs), question)


class ConversationTexts:
    """ShareGPT conversations as sources: the user's messages and the answers are the evidence."""

    def __init__(self, texts: list[tuple[str, ...]]):
        self.texts = texts
        self.name = f"{len(texts)} ShareGPT conversations"

    def domain_of(self, source: int) -> int:
        return 0

    def unrelated(self, source: int) -> int:
        return source + len(self.texts) // 2  # half the file away: another conversation

    def document(self, source: int) -> Document:
        messages = self.texts[source % len(self.texts)]
        first = messages[0].strip().splitlines()[0][:200] if messages[0].strip() else "this conversation"
        return Document(source, "sharegpt", tuple(m for m in messages if m.strip()),
                        f"Going back to the request '{first}', what was the outcome?")
