"""Semantic donor reuse for one run: find a request's donors, count SemBench's metrics, register it.

Per request (after the exact prefix lookup): embed the prompt, search the
donor store (top-k cosine, plus, with multi-donor on, donors found through
the chunk index), align the candidates (donors.py), each step timed into the
recorder (``semantic/embed|search|align|total``). The plan names, per recipient
block it covers, the donor blocks (cache keys) to read; the lifecycle reads
them (op ``donor_read``) and writes only the blocks still missing.
Approximate reuse never enters the exact prefix index: a block loaded from
a donor is not written under the recipient's key, and is not offered as a
donor block either. Every served request then becomes a donor.

Metric counters (per transform, recipients only): blocks, exact_blocks,
candidate_blocks (exact, or found in any candidate donor before the gate and
the reuse threshold), eligible_blocks (exact, or covered by an accepted
donor), semantic_blocks (eligible and not exact), fuzzy_blocks,
loaded_blocks (semantic blocks whose donor blocks were all still cached and
read), found (the intended donor was among the search results), accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic_ns as now_ns

import numpy as np

from kv_cache.lifecycle.donors import Cover, DonorStore, Windows, cover, fuzzy_cover, make_donor
from kv_cache.types import RequestOutcome


@dataclass
class DonorPlan:
    """What the donors give one request."""

    vector: np.ndarray
    reads: dict[int, tuple[int, ...]] = field(default_factory=dict)  # recipient block -> donor cache keys
    candidate: int = 0
    semantic: int = 0
    fuzzy: int = 0
    found_intended: bool = False
    accepted: int = 0
    block_hashes: np.ndarray | None = None  # content hash of each prompt block (from the window hashes)


class SemanticReuse:
    """The donor store of this process and the settings of discovery."""

    def __init__(self, settings, block_tokens: int, embedder, recorder):
        self.s, self.bt, self.embedder, self.recorder = settings, block_tokens, embedder, recorder
        self.store = DonorStore(embedder.dims, settings.max_donors, block_tokens)

    def find(self, req, n_blocks: int, exact: set[int]) -> DonorPlan:
        spent = dict.fromkeys(("embed", "search", "align"), 0)  # ns per stage, recorded at the end
        begin = t = now_ns()

        def lap(stage: str) -> None:
            nonlocal t
            t, before = now_ns(), t
            spent[stage] += t - before

        plan = DonorPlan(self.embedder.embed(req.prompt_tokens, req))
        lap("embed")
        windows = Windows(req.prompt_tokens, self.bt)
        plan.block_hashes = windows.hashes[::self.bt][:n_blocks]  # kept for registering it as a donor
        found = self.store.search(plan.vector, self.s.top_k, self.s.threshold)
        lap("search")
        exact_mask = np.zeros(n_blocks, dtype=bool)
        exact_mask[list(exact)] = True
        missed = n_blocks - len(exact)
        covers: list[Cover] = []
        if missed > 0 and found:
            covers = self._align(windows, found, exact_mask)
            self._choose(plan, req.prompt_tokens, covers, exact_mask, missed)
            lap("align")
        if missed > 0 and not plan.reads and self.s.multi_donor:
            # Pieces of several donors, none similar enough as a whole: found by their chunks.
            more = self.store.by_chunks(windows.hashes, plan.vector, {id(d) for d, _ in found}, self.s.top_k)
            lap("search")
            if more:
                found += more
                covers += self._align(windows, more, exact_mask)
                self._choose(plan, req.prompt_tokens, covers, exact_mask, missed)
                lap("align")
        tag = req.semantic
        plan.found_intended = tag is not None and any(d.item == tag.item and d.role == "donor" for d, _ in found)
        for stage, ns in spent.items():
            self.recorder.lookup(stage, begin, ns)
        self.recorder.lookup("total", begin, now_ns() - begin)
        return plan

    def _align(self, windows: Windows, found: list, exact: np.ndarray) -> list[Cover]:
        return [cover(windows, exact.size, self.bt, d, self.s.context_gate) for d, _ in found]

    def _choose(self, plan: DonorPlan, tokens: np.ndarray, covers: list[Cover], exact: np.ndarray,
                missed: int) -> None:
        """Assemble the aligned candidates greedily (several donors if allowed); accepted only if they cover
        min_reuse of the blocks the exact prefix missed."""
        plan.candidate = int((np.logical_or.reduce([c.covered for c in covers]) & ~exact).sum())
        union = exact.copy()
        reads: dict[int, tuple[int, ...]] = {}
        chosen = 0
        for c in sorted(covers, key=lambda c: -int((c.gated & ~exact).sum())):
            new = c.gated & ~union
            if not new.any():
                continue
            chosen += 1
            union |= new
            reads.update({r: tuple(int(c.donor.keys[b]) for b in c.reads[r]) for r in np.flatnonzero(new)})
            if not self.s.multi_donor:
                break
        if self.s.fuzzy:
            extra = fuzzy_cover(tokens, self.bt, covers[0], ~union, self.s.fuzzy_overlap)
            for r, blocks in extra.items():
                reads[r] = tuple(int(covers[0].donor.keys[b]) for b in blocks)
            plan.fuzzy = len(extra)
            plan.candidate += sum(1 for r in extra if not covers[0].covered[r])
        if len(reads) >= self.s.min_reuse * missed:
            plan.reads, plan.semantic, plan.accepted = reads, len(reads), max(chosen, 1)
        else:
            plan.fuzzy = 0

    def finish(self, req, plan, dplan: DonorPlan, exact: set[int], loaded: set[int],
               outcome: RequestOutcome) -> None:
        """Add the request's metrics to its outcome (recipients) and offer it as a donor to later requests."""
        n = plan.num_prompt_blocks
        tag = req.semantic
        if tag is not None and tag.role == "recipient":
            mine = {"requests": 1, "blocks": n, "tokens": req.num_prompt_tokens, "exact_blocks": len(exact),
                    "candidate_blocks": len(exact) + dplan.candidate, "eligible_blocks": len(exact) + dplan.semantic,
                    "semantic_blocks": dplan.semantic, "fuzzy_blocks": dplan.fuzzy, "loaded_blocks": len(loaded),
                    "found": int(dplan.found_intended), "accepted": int(dplan.accepted > 0)}
            for k in ("exact", "candidate", "eligible", "semantic", "loaded"):
                mine[f"{k}_tokens"] = mine[f"{k}_blocks"] * self.bt
            outcome.semantic[tag.transform] = mine
        rid = f"{req.user_id}.{req.seq}"
        donor = make_donor(rid, tag.item if tag else None, tag.role if tag else "request", req.prompt_tokens,
                           plan.keys[:n], self.bt, skip=loaded, fuzzy=self.s.fuzzy, hashes=dplan.block_hashes)
        self.store.add(dplan.vector, donor)
