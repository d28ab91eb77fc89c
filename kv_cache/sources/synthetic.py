"""Synthetic users: chatbot, coding and document profiles in multi-turn conversations.

Vocabulary: a *conversation* starts with one of a few shared *system
prompts* followed by the user's first context; each later *turn*'s prompt
is the previous prompt + the previous answer + a new message, so the
history is a real prefix of the next prompt and its blocks really hit.
Every user draws from its own generator seeded by (seed, user id), so a
user's sequence of requests is the same in every run whatever the thread
timing. Token ids are random in [0, vocab): content has no meaning, only
identity.
"""

from __future__ import annotations

import numpy as np

from kv_cache.config import ProfileSettings, RagSettings, WorkloadSettings, parse_mix
from kv_cache.sources.content import DOCUMENT, stream
from kv_cache.types import HISTORY, RAG, SYSTEM, USER, Request

TOKEN = np.int32  # a token id, as every synthetic prompt and answer holds it


def _uniform_int(rng: np.random.Generator, lo_hi) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1], endpoint=True))


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Popularity of ranks 0..n-1: weight 1/(rank+1)^s, normalised."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


class SystemPrompts:
    """The shared system prompts, identical for every user, run and host with the same seed."""

    def __init__(self, count: int, length_range, vocab: int, seed: int, zipf: float = 0.0):
        rng = np.random.default_rng([seed, 0x5157])
        self.prompts = [rng.integers(0, vocab, _uniform_int(rng, length_range), dtype=TOKEN)
                        for _ in range(count)]
        self.weights = zipf_weights(count, zipf) if count and zipf else None

    def pick(self, rng: np.random.Generator) -> np.ndarray:
        if not self.prompts:
            return np.empty(0, TOKEN)
        if self.weights is None:
            return self.prompts[int(rng.integers(len(self.prompts)))]
        return self.prompts[int(rng.choice(len(self.prompts), p=self.weights))]


class Corpus:
    """RAG documents: lengths cut at block boundaries (padded to whole blocks), Zipf popularity."""

    def __init__(self, rag: RagSettings, block_tokens: int, vocab: int, seed: int):
        rng = np.random.default_rng([seed, 0xD0C5])
        unit = max(block_tokens, 1)
        raw = rng.integers(rag.document_tokens[0], rag.document_tokens[1], rag.num_documents, endpoint=True)
        self.lengths = (-(-raw // unit) * unit).astype(np.int64)
        self.weights = zipf_weights(rag.num_documents, rag.zipf)
        self.top_k = min(rag.top_k, rag.num_documents)
        self.probability = rag.request_probability
        self.vocab = vocab

    def retrieve(self, rng: np.random.Generator) -> list[int]:
        """top_k distinct documents, drawn by popularity, in retrieval order."""
        return [int(d) for d in rng.choice(self.lengths.size, self.top_k, replace=False, p=self.weights)]

    def tokens(self, doc: int) -> np.ndarray:
        return stream(DOCUMENT, doc, int(self.lengths[doc]), self.vocab)


class SyntheticUser:
    """One closed-loop user: yields its requests in order."""

    def __init__(self, user_id: int, workload: WorkloadSettings, profiles: ProfileSettings,
                 mix: dict[str, float], system: SystemPrompts, seed: int, corpus: Corpus | None = None):
        self.user_id = user_id
        self.rng = np.random.default_rng([seed, 0x05E5, user_id])
        names = sorted(mix)
        self.profile_name = names[int(self.rng.choice(len(names), p=[mix[n] for n in names]))]
        self.profile = getattr(profiles, self.profile_name)
        self.workload = workload
        self.system = system
        self.corpus = corpus
        self.docs: tuple[tuple[int, int, int], ...] = ()
        self.seq = 0
        self.turn = 0
        self.history: np.ndarray | None = None
        self.system_len = 0
        self.first_delay_s = float(self.rng.uniform(*self.profile.think_time_s))

    def _tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.workload.vocab_size, n, dtype=TOKEN)

    def _new_conversation(self) -> tuple[np.ndarray, tuple]:
        sys_tokens = self.system.pick(self.rng)
        self.turn, self.system_len, self.docs = 1, sys_tokens.size, ()
        parts = [sys_tokens]
        if self.corpus is not None and self.rng.random() < self.corpus.probability:
            # A RAG conversation: retrieved documents, then the question (a user message).
            at, docs = sys_tokens.size, []
            for d in self.corpus.retrieve(self.rng):
                parts.append(self.corpus.tokens(d))
                docs.append((at, at + parts[-1].size, d))
                at += parts[-1].size
            self.docs = tuple(docs)
            context = self._tokens(_uniform_int(self.rng, self.profile.message_tokens))
        else:
            room = max(1, self.profile.max_context_tokens - sys_tokens.size)
            context = self._tokens(min(_uniform_int(self.rng, self.profile.context_tokens), room))
        prompt = np.concatenate(parts + [context])
        return prompt, ((self.system_len, SYSTEM), *self._rag_span(), (prompt.size, USER))

    def _rag_span(self) -> tuple:
        return ((self.docs[-1][1], RAG),) if self.docs else ()

    def _follow_up(self) -> tuple[np.ndarray, tuple] | None:
        if self.history is None or self.turn >= self.workload.max_turns:
            return None
        if self.rng.random() < self.workload.end_probability:
            return None
        message_len = _uniform_int(self.rng, self.profile.message_tokens)
        if self.history.size + message_len > self.profile.max_context_tokens:
            return None
        self.turn += 1
        prompt = np.concatenate([self.history, self._tokens(message_len)])
        return prompt, ((self.system_len, SYSTEM), *self._rag_span(), (self.history.size, HISTORY),
                        (prompt.size, USER))

    def next_request(self) -> Request:
        """The user's next request (deterministic for a given seed and user id)."""
        turn = self._follow_up() or self._new_conversation()
        prompt, spans = turn
        output = self._tokens(_uniform_int(self.rng, self.profile.output_tokens))
        think = float(self.rng.uniform(*self.profile.think_time_s))
        self.history = np.concatenate([prompt, output])
        self.seq += 1
        return Request(self.user_id, self.seq, self.turn, prompt, output, spans, think_s=think,
                       profile=self.profile_name, docs=self.docs)


def longest_history_bytes(workload: WorkloadSettings, profiles: ProfileSettings, rag: RagSettings | None = None,
                    block_tokens: int = 0) -> int:
    """The most bytes a user's history (its last prompt and answer) can hold, over the profiles --profile-mix
    uses: a follow-up's prompt stays within its profile's max_context_tokens, a first turn's too unless it opens
    with retrieved documents (the system prompt, top_k documents of whole blocks each, the message); an answer adds
    at most the profile's longest (the memory budget counts every user's, run/sizing.py)."""
    mix = parse_mix(workload.profile_mix, tuple(ProfileSettings.__dataclass_fields__), "--profile-mix")
    longest = 0
    for name in (n for n, w in mix.items() if w > 0):
        p = getattr(profiles, name)
        prompt = max(p.max_context_tokens, workload.system_prompt_tokens[1] + 1)  # a first turn's context: 1 at least
        if rag is not None and rag.enabled:
            unit = max(block_tokens, 1)
            doc = -(-rag.document_tokens[1] // unit) * unit
            prompt = max(prompt, workload.system_prompt_tokens[1] + min(rag.top_k, rag.num_documents) * doc
                         + p.message_tokens[1])
        longest = max(longest, prompt + p.output_tokens[1])
    return longest * np.dtype(TOKEN).itemsize


def make_users(num_users: int, workload: WorkloadSettings, profiles: ProfileSettings, seed: int,
               owns=None, rag: RagSettings | None = None, block_tokens: int = 0) -> list[SyntheticUser]:
    """Users 0 .. num_users - 1 (those owns(u) accepts, under MPI), sharing the system prompts and corpus."""
    return list(each_user(num_users, workload, profiles, seed, owns, rag, block_tokens))


def each_user(num_users: int, workload: WorkloadSettings, profiles: ProfileSettings, seed: int,
              owns=None, rag: RagSettings | None = None, block_tokens: int = 0):
    """make_users' users one at a time, each made as it is asked for (a user is about 50 us to make: a sample of a
    few hundred of a million users need not make them all)."""
    known = tuple(f for f in ProfileSettings.__dataclass_fields__)
    mix = parse_mix(workload.profile_mix, known, "--profile-mix")
    system = SystemPrompts(workload.num_system_prompts, workload.system_prompt_tokens, workload.vocab_size, seed,
                           workload.system_prompt_zipf)
    corpus = Corpus(rag, block_tokens, workload.vocab_size, seed) if rag is not None and rag.enabled else None
    return (SyntheticUser(u, workload, profiles, mix, system, seed, corpus)
            for u in range(num_users) if owns is None or owns(u))
