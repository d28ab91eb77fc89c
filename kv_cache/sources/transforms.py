"""Semantic traffic: SemBench's transforms, each a donor (seeded first) and a recipient (measured).

Vocabulary: an *item* is one transform applied to one source document; its
*donors* are the requests that put KV in the cache, its *recipient* the
request that says the same thing in other words. Transforms (SemBench v1):

- exact_repeat:               the same prompt again (positive control of exact caching)
- instruction_variant:        the same evidence under another instruction wrapper (miss at token 0)
- same_evidence_new_task:     another task, its question moved before the evidence
- leading_evidence_new_task:  donor and recipient both open with the evidence (an exact prefix aligns)
- rag_reorder:                the evidence as retrieved records, in reverse order
- multi_donor_composite:      one donor per evidence segment; the recipient concatenates them
- fuzzy_edit:                 whitespace collapsed, ". " made ".\\n", a metadata header: every block changes
- negative_control:           the donor comes from an unrelated source (must stay cold)

A user draws item k's transform and source from (seed, user, k) alone, so
the request schedule is the same in every run. Prompts are tokenized one
segment at a time (wrapper, record header, evidence, question), so equal
text gives equal tokens wherever it sits.
"""

from __future__ import annotations

import re

import numpy as np

from kv_cache.config import parse_mix
from kv_cache.sources.content import OUTPUT, stream
from kv_cache.sources.textcorpus import Document
from kv_cache.types import RAG, TEMPLATE, USER, Request, SemanticTag

TRANSFORMS = ("exact_repeat", "instruction_variant", "same_evidence_new_task", "leading_evidence_new_task",
              "rag_reorder", "multi_donor_composite", "fuzzy_edit", "negative_control")
BASE = "You are a careful assistant. Read the evidence below and answer the question at the end.\n\nEvidence:\n"
ANALYST = "As an enterprise analyst, review the following material and give a precise, sourced answer.\n\nMaterial:\n"
OPS = "Prepare a short operations brief for the on-call team.\n"
MAX_SEGMENTS = 4

Segments = list[tuple[str, str]]  # (text, span label)


def _question(doc: Document) -> tuple[str, str]:
    return ("\n\nQuestion: " + doc.question, USER)


def _wrapped(wrapper: str, doc: Document) -> Segments:
    """The evidence under an instruction wrapper, then the question."""
    return [(wrapper, TEMPLATE), (doc.context, RAG), _question(doc)]


def segments_of(doc: Document) -> list[str]:
    """The evidence cut into at most four segments of whole paragraphs (SemBench's rag_reorder)."""
    paras = list(doc.paragraphs)
    n = min(MAX_SEGMENTS, len(paras))
    cuts = np.linspace(0, len(paras), n + 1).astype(int)
    return ["\n\n".join(paras[a:b]) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _records(segs: list[str], order) -> Segments:
    out: Segments = [(BASE, TEMPLATE)]
    for i in order:
        out += [(f"\n[retrieved_record id=R{i:02d}]\n", TEMPLATE), (segs[i], RAG)]
    return out


def fuzzy(text: str) -> str:
    """fuzzy_edit's rewrite: whitespace collapsed, every sentence end followed by a newline."""
    return re.sub(r"\s+", " ", text).replace(". ", ".\n")


def transform(name: str, doc: Document, unrelated: Document | None = None) -> tuple[list[Segments], Segments]:
    """(donor prompts, recipient prompt) of one item, as labelled text segments."""
    question = _question(doc)
    if name == "exact_repeat":
        return [_wrapped(BASE, doc)], _wrapped(BASE, doc)
    if name == "instruction_variant":
        return [_wrapped(BASE, doc)], _wrapped(ANALYST, doc)
    if name == "same_evidence_new_task":
        return [_wrapped(BASE, doc)], [(OPS, TEMPLATE), ("Question: " + doc.question + "\n\nEvidence:\n", USER),
                              (doc.context, RAG)]
    if name == "leading_evidence_new_task":
        return ([[(doc.context, RAG), ("\n\nCache entry: summarise the evidence above.", USER)]],
                [(doc.context, RAG), ("\n\nNew request: " + doc.question, USER)])
    if name == "rag_reorder":
        segs = segments_of(doc)
        return [_records(segs, range(len(segs))) + [question]], \
            _records(segs, reversed(range(len(segs)))) + [question]
    if name == "multi_donor_composite":
        segs = segments_of(doc)
        donors = [[(f"Cached enterprise evidence segment {i + 1}:\n", TEMPLATE), (s, RAG)] for i, s in enumerate(segs)]
        recipient: Segments = [(BASE, TEMPLATE)]
        for i, s in enumerate(segs):
            recipient += [(f"\nDocument {i + 1}:\n", TEMPLATE), (s, RAG)]
        return donors, recipient + [question]
    if name == "fuzzy_edit":
        header = f"[metadata: source={doc.source:x} domain={doc.domain} revision=2]\n"
        return [_wrapped(BASE, doc)], [(header, TEMPLATE), (BASE, TEMPLATE), (fuzzy(doc.context), RAG), question]
    if name == "negative_control":
        return [_wrapped(BASE, unrelated)], _wrapped(ANALYST, doc)
    raise ValueError(f"unknown transform {name}")


class SemanticUser:
    """One closed-loop user running items back to back: an item's donors, then its recipient."""

    def __init__(self, user_id: int, texts, mix: dict[str, float], tokenizer, seed: int, profile, vocab: int):
        self.user_id, self.texts, self.tokenizer, self.seed = user_id, texts, tokenizer, seed
        self.names = sorted(mix)
        self.weights = np.array([mix[n] for n in self.names]) / sum(mix.values())
        self.profile, self.vocab = profile, vocab
        self.seq = self.item = 0
        self.pending: list[Request] = []
        self.first_delay_s = float(np.random.default_rng([seed, 0x5E3, user_id]).uniform(*profile.think_time_s))

    def next_request(self) -> Request:
        if not self.pending:
            self._new_item()
        return self.pending.pop(0)

    def _new_item(self) -> None:
        rng = np.random.default_rng([self.seed, 0x5E4, self.user_id, self.item])
        name = self.names[int(rng.choice(len(self.names), p=self.weights))]
        source = (self.user_id << 32) | self.item  # never reused: each item has evidence of its own
        doc = self.texts.document(source)
        other = self.texts.document(self.texts.unrelated(source)) if name == "negative_control" else None
        donors, recipient = transform(name, doc, other)
        cache: dict[str, np.ndarray] = {}
        item = f"{self.user_id}.{self.item}"
        for role, segs in [("donor", d) for d in donors] + [("recipient", recipient)]:
            prompt, spans = self._tokens(segs, cache)
            self.seq += 1
            output = stream(OUTPUT, (self.user_id << 40) | self.seq, _draw(rng, self.profile.output_tokens),
                            self.vocab)
            self.pending.append(Request(self.user_id, self.seq, 1, prompt, output, spans,
                                        think_s=float(rng.uniform(*self.profile.think_time_s)), profile="semantic",
                                        semantic=SemanticTag(item, name, role, source),
                                        text="".join(text for text, _ in segs)))
        self.item += 1

    def _tokens(self, segs: Segments, cache: dict) -> tuple[np.ndarray, tuple]:
        parts, spans, at = [], [], 0
        for text, label in segs:
            toks = cache.get(text)
            if toks is None:
                toks = cache[text] = np.asarray(self.tokenizer.encode(text), dtype=np.int32)
            parts.append(toks)
            at += toks.size
            if spans and spans[-1][1] == label:
                spans[-1] = (at, label)
            else:
                spans.append((at, label))
        return np.concatenate(parts), tuple(spans)


def _draw(rng: np.random.Generator, lo_hi) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1], endpoint=True))


def make_semantic_users(num_users: int, texts, mix_text: str, tokenizer, seed: int, profile, vocab: int,
                        owns=None) -> list[SemanticUser]:
    """Users 0 .. num_users - 1 (those owns(u) accepts, under MPI) drawing items in the shares of mix_text."""
    mix = parse_mix(mix_text, TRANSFORMS, "--semantic-mix")
    return [SemanticUser(u, texts, mix, tokenizer, seed, profile, vocab) for u in range(num_users)
            if owns is None or owns(u)]
