"""ShareGPT conversations, replayed turn by turn with their whole history as the prompt.

Vocabulary: a conversation's *turn* is one user message and the answer that
follows it. Turn k's prompt is the system prompt (the conversation's own, or
one of the shared system prompts) + every earlier message and answer + the
new message, so history blocks are real prefix hits; the answer's length
comes from the real gpt turn. Accepts vLLM's JSON array of
``{id, conversations: [{from, value}]}`` and the same objects as JSON Lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from kv_cache.sources.content import OUTPUT, stream
from kv_cache.sources.trace_io import TraceLog, jsonl_records, not_utf8, opens_an_array
from kv_cache.types import HISTORY, INJECTED, SYSTEM, USER, Request

USER_ROLES = {"human", "user"}
ASSISTANT_ROLES = {"gpt", "chatgpt", "assistant", "bing", "bard", "model"}

GIVEN, CUT = "answers_given_fixed_length", "answers_cut"
CHANGED = {  # a turn kept with a change (TraceLog.changed) -> what was done to it
    GIVEN: "no answer in the file: given trace.missing_answer_tokens tokens (--set trace.missing_answer_tokens=0 "
           "drops such turns)",
    CUT: "cut to trace.max_output_tokens",
}


@dataclass(frozen=True)
class ShareGPTOptions:
    first_turn_only: bool = False
    min_prompt_tokens: int = 1
    max_prompt_tokens: int = 0    # 0: no limit; a longer turn ends its conversation (later turns only grow)
    max_output_tokens: int = 0    # 0: no limit; longer answers are cut to it
    max_conversations: int = 0    # 0: all
    shuffle: bool = True
    missing_answer_tokens: int = 128  # a message with no answer gets one this long (0: drop it)


@dataclass(slots=True)
class ShareGPTTurn:
    """One turn of a conversation: its prompt is parts[0] + ... + parts[-1]."""

    index: int
    session: int
    turn: int
    parts: tuple[np.ndarray, ...]   # system, earlier messages and answers..., the new message
    system_len: int
    answer: np.ndarray
    injected: bool = False  # its system prompt is one of the benchmark's shared ones (the conversation had none)
    arrival_s: float | None = None

    def build(self, vocab: int) -> Request:
        prompt = np.concatenate(self.parts)
        history = prompt.size - self.parts[-1].size
        spans = ((self.system_len, INJECTED if self.injected else SYSTEM), (history, HISTORY), (prompt.size, USER))
        return Request(0, self.index + 1, self.turn, prompt, self.answer, spans, session=self.session,
                       profile="sharegpt", arrival_s=self.arrival_s)


def _conversations(path: str, log: TraceLog):
    """(file:line, conversation object) from a JSON array or a JSONL file."""
    if opens_an_array(path):
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            log.bad(f"{path}:{e.lineno}", f"not valid JSON ({e.msg}); nothing of this file was used")
            return
        for i, conv in enumerate(data):
            yield f"{path}[{i}]", conv
    else:
        yield from jsonl_records(path, log)


def _messages(where: str, conv, log: TraceLog) -> list[tuple[str, str]] | None:
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not isinstance(turns, list):
        log.bad(where, "a conversation needs a 'conversations' list")
        return None
    out: list[tuple[str, str]] = []
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            log.bad(where, "every turn needs 'from' and a string 'value'")
            return None
        if not_utf8(t["value"]):
            log.bad(where, "a turn's text is not valid UTF-8")
            return None
        who = str(t.get("from", "")).lower()
        role = "user" if who in USER_ROLES else "assistant" if who in ASSISTANT_ROLES else \
            "system" if who == "system" else None
        if role is None:
            log.bad(where, f"unknown speaker {t.get('from')!r}")
            return None
        if out and out[-1][0] == role:  # merge consecutive messages of one speaker
            out[-1] = (role, out[-1][1] + "\n" + t["value"])
        else:
            out.append((role, t["value"]))
    return out


def load(files: list[str], tokenizer, system_for, opts: ShareGPTOptions, seed: int,
         log: TraceLog) -> list[ShareGPTTurn]:
    """system_for(session) gives the shared system prompt of a conversation that has none."""
    """Every usable turn of every conversation, conversations in (seeded, shuffled) order."""
    convs = [(w, c) for path in files for w, c in _conversations(path, log)]
    order = np.random.default_rng([seed, 0x5A6]).permutation(len(convs)) if opts.shuffle else range(len(convs))
    turns: list[ShareGPTTurn] = []
    used = 0
    for ci in order:
        if opts.max_conversations and used >= opts.max_conversations:
            break
        where, conv = convs[ci]
        msgs = _messages(where, conv, log)
        if not msgs:
            continue
        before = len(turns)
        _add_turns(turns, msgs, tokenizer, system_for, opts, session=int(ci), log=log)
        used += len(turns) > before
    return turns


def _add_turns(turns, msgs, tokenizer, system_for, opts, session, log) -> None:
    if msgs[0][0] == "system":
        system, msgs, injected = tokenizer.encode(msgs[0][1]), msgs[1:], False
    else:
        system = system_for(session)
        injected = system.size > 0  # workload.num_system_prompts 0: nothing is put before it
    parts: list[np.ndarray] = [system]
    k = 0
    for i, (role, text) in enumerate(msgs):
        if role != "user":
            continue
        message = tokenizer.encode(text)
        if i + 1 < len(msgs) and msgs[i + 1][0] == "assistant":
            answer = tokenizer.encode(msgs[i + 1][1])
        elif opts.missing_answer_tokens:
            # NOTE: vLLM's --sharegpt-output-len: a prompt without an answer gets a fixed-length one.
            answer = stream(OUTPUT, (session << 20) + k, opts.missing_answer_tokens, 100_000)
            log.changed[GIVEN] += 1
        else:
            log.skipped["answers_missing"] += 1
            continue
        if opts.max_output_tokens and answer.size > opts.max_output_tokens:
            answer = answer[: opts.max_output_tokens]
            log.changed[CUT] += 1
        prompt_len = sum(p.size for p in parts) + message.size
        if opts.max_prompt_tokens and prompt_len > opts.max_prompt_tokens:
            log.skipped["turns_over_max_prompt"] += 1
            return
        k += 1
        if prompt_len >= opts.min_prompt_tokens and answer.size:
            turns.append(ShareGPTTurn(len(turns), session, k, tuple(parts) + (message,), system.size, answer,
                                      injected))
        else:
            log.skipped["turns_filtered"] += 1
        if opts.first_turn_only:
            return
        parts += [message, answer]


def conversation_texts(files: list[str], log: TraceLog, max_conversations: int = 0) -> list[tuple[str, ...]]:
    """The text of every usable conversation (its messages and answers, in order), in file order."""
    out: list[tuple[str, ...]] = []
    for path in files:
        for where, conv in _conversations(path, log):
            msgs = _messages(where, conv, log)
            if msgs and any(text.strip() for _, text in msgs):
                out.append(tuple(text for _, text in msgs))
            if max_conversations and len(out) >= max_conversations:
                return out
    return out
