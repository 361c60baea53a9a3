"""The requests and the rows they decode in (`Scheduler`): at most `max_batch` requests decode at once. A
request joins a free row by a prefill (of each distinct prompt once, its KV entries copied into every row
that samples that prompt, so N samples of one prompt pay for one prefill) and its first token is sampled from
the prefill. When a row finishes (EOS or its token limit) the next waiting request takes it; once the queue is
empty, finished rows are dropped (`compaction`).
"""

from collections import Counter, deque
from itertools import islice

import torch
from tqdm import tqdm

from bebop.drafts.base import Draft, target_forward
from bebop.engine.draft_len import Acceptance
from bebop.engine.stats import SpecStats
from bebop.engine.step import Rows
from bebop.models.decoder import Decoder
from bebop.sampling import SamplingParams, entropy, probabilities, sample
from bebop.seeds import row_seeds

MIN_PROB = 1e-30  # the floor of a probability whose log is recorded
PREFILL_PADDING = 0.2  # padded positions a prefill forward may compute, as a share of its prompts' tokens


def row_generators(seed: int | list[int], batch: int) -> list[torch.Generator]:
    """One generator per request: from its own seed, or row b's of the batch seed `seed` (bebop.seeds)."""
    seeds = seed if isinstance(seed, list) else row_seeds(seed, batch)
    return [torch.Generator().manual_seed(int(s) % 2**64) for s in seeds]  # any int seed; torch takes 64 bits


def right_pad(seqs, pad: int = 0) -> torch.Tensor:
    """[len(seqs), longest] token ids (lists or tensors), each row right-padded with `pad`."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def length_groups(prompts: list, waste: float = PREFILL_PADDING) -> list[list]:
    """The prompts in groups of similar lengths, shortest first, each to be prefilled in one padded forward: a
    group grows while its padding stays within `waste` of its real tokens. (Padded together, 64 held-out chat
    prompts of 36 to 107 tokens computed 1.7x their tokens.)"""
    groups = []
    for p in sorted(prompts, key=len):
        group = groups[-1] if groups else None
        if group is None or (len(group) + 1) * len(p) > (1 + waste) * (sum(map(len, group)) + len(p)):
            groups.append(group := [])
        group.append(p)
    return groups


def compaction(n_rows: int, gone: set[int]) -> torch.Tensor:
    """The rows to keep, in their new order, when the rows `gone` finish: a surviving row keeps its place
    unless it lies beyond the new batch size, in which case it fills a finished row's slot (so the KV cache
    copies one row per finished row, not the whole batch; KVCache.keep_rows)."""
    n = n_rows - len(gone)
    movers = [r for r in range(n, n_rows) if r not in gone]
    return torch.tensor([movers.pop() if r in gone else r for r in range(n)], dtype=torch.long)


class Scheduler:
    """The requests and the rows they decode in: prefill (each distinct prompt once, a batch ahead),
    admission into free rows (each request's first token sampled from its prefill), recording what each step
    emitted, finishing rows at EOS or the token limit, and compaction once no request waits."""

    def __init__(self, target: Decoder, mtp: Draft | None, prompts, rollouts, max_new_tokens: int,
                 params: SamplingParams, seed, cache, mcache, eos: set[int], acceptance: Acceptance | None, on_finish,
                 progress: bool, mode: str):
        self.target, self.mtp, self.prompts, self.params = target, mtp, prompts, params
        self.max_new_tokens, self.cache, self.mcache, self.acceptance = max_new_tokens, cache, mcache, acceptance
        self.device = target.embed.weight.device
        self.eos, self.eos_t = eos, torch.tensor(sorted(eos), dtype=torch.long, device=self.device)
        self.on_finish = on_finish
        N, self.batch = len(prompts), cache.lengths.shape[0]
        self.request_gens = row_generators(seed, N)
        self.out = rollouts  # one per prompt, filled in as its row emits tokens
        self.stats = SpecStats()
        self.queue = deque(range(N))
        self.waiting = Counter(tuple(p) for p in prompts)
        self.prefilled = {}  # prompt -> (cache, MTP cache, row, the MTP's input at its last position, p of token 1)
        feat_dim = target.cfg.dim * (len(mtp.feature_layers) if mtp is not None and mtp.feature_layers else 1)
        self.rows = Rows.empty(self.batch, feat_dim, target.embed.weight.dtype, self.device)
        self.bar = tqdm(total=N * max_new_tokens, desc=f"generate {mode}", unit="tok", disable=not progress,
                        leave=False)

    def finish(self, i: int, reason: str) -> None:
        self.out[i].stop_reason = reason
        if self.on_finish is not None:
            self.on_finish(i, self.out[i])

    def prefill(self, requests) -> None:
        """Prefill the distinct prompts among `requests` that are not prefilled yet: one forward per group of
        similar lengths (length_groups)."""
        new = list(dict.fromkeys(key for key in (tuple(self.prompts[i]) for i in requests) if key not in self.prefilled))
        for group in length_groups(new):
            self.prefill_padded(group)

    def prefill_padded(self, new: list[tuple[int, ...]]) -> None:
        """Prefill these prompts in one forward, right-padded to the longest."""
        target, mtp = self.target, self.mtp
        lens = torch.tensor([len(p) for p in new], device=self.device)
        tokens = right_pad(new).to(self.device)  # a row's padding is never attended to
        tc = target.new_cache(len(new), tokens.shape[1])
        hidden, feats = target_forward(target, mtp, tokens, tc)
        tc.lengths = lens.clone()
        last = hidden[torch.arange(len(new), device=self.device), lens - 1]
        p = probabilities(target.logits(last), self.params)
        tmc = None
        if mtp is not None:  # the MTP sees every prompt position but the last now; the last comes with token 1
            tmc = mtp.new_cache(len(new), tokens.shape[1])
            if tokens.shape[1] > 1:
                mtp(tokens[:, 1:], mtp.features(feats[:, :-1]), tmc)
            tmc.lengths = lens - 1
        last_feats = feats[torch.arange(len(new), device=self.device), lens - 1]
        for j, key in enumerate(new):
            self.prefilled[key] = (tc, tmc, j, last_feats[j], p[j])

    def admit(self, row: int, i: int) -> bool:
        """Put request i into `row` and sample its first token; True if that already finishes it."""
        key = tuple(self.prompts[i])
        tc, tmc, j, last, p = self.prefilled[key]
        self.waiting[key] -= 1
        if self.waiting[key] == 0:
            del self.prefilled[key]
        self.cache.write_rows(row, tc, j)
        if self.mcache is not None:
            self.mcache.write_rows(row, tmc, j)
        if self.acceptance is not None:
            self.acceptance.reset_row(row)
        g = self.request_gens[i]
        tok = int(sample(p, torch.rand(1, generator=g, dtype=torch.float64)[0].to(p.device)))
        rows = self.rows
        rows.request[row], rows.gen[row], rows.n_out[row], rows.pending[row] = i, g, 1, tok
        rows.pile_tokens[row, 0], rows.pile_feats[row, 0], rows.pile_count[row] = tok, last, 1
        ro = self.out[i]
        ro.tokens.append(tok)
        ro.logprobs.append(float(p[tok].clamp_min(MIN_PROB).log()))
        ro.entropies.append(float(entropy(p)))
        self.stats.tokens += 1
        self.stats.entropy_sum += ro.entropies[-1]
        self.bar.update(1)
        if tok in self.eos or self.max_new_tokens == 1:
            self.finish(i, "eos" if tok in self.eos else "length")
            return True
        return False

    def fill(self, free) -> list[int]:
        """Give free rows to waiting requests; returns the rows still free when the queue ran dry. Prompts are
        prefilled a batch ahead: rows free up one or two at a time, and one forward over many prompts costs
        far less than many forwards over one."""
        free = list(free)
        while free and self.queue:
            if tuple(self.prompts[self.queue[0]]) not in self.prefilled:  # the last batch ahead is used up
                self.prefill(islice(self.queue, max(len(free), self.batch)))
            row = free.pop(0)
            if self.admit(row, self.queue.popleft()):
                free.append(row)
        return free

    def compact(self, free: list[int]) -> bool:
        """The queue is empty: drop the free rows so later forwards do no work for them. False if none is left."""
        keep = compaction(len(self.rows), set(free))
        if len(keep) == 0:
            return False
        self.rows = self.rows.keep(keep)
        self.cache.keep_rows(keep)
        if self.mcache is not None:
            self.mcache.keep_rows(keep)
        if self.acceptance is not None:
            self.acceptance.keep_rows(keep)
        return True

    def record(self, step_tokens, num_accepted, p) -> list[int]:
        """Append each row's emitted tokens (cut at EOS or the limit); returns the rows that finished."""
        rows = self.rows
        n_emit = torch.minimum(num_accepted + 1, self.max_new_tokens - rows.n_out)
        cols = torch.arange(step_tokens.shape[1], device=step_tokens.device).unsqueeze(0)
        is_eos = torch.isin(step_tokens, self.eos_t) & (cols < n_emit.unsqueeze(1))
        hit_eos = is_eos.any(1)
        n_emit = torch.where(hit_eos, is_eos.long().argmax(1) + 1, n_emit)
        valid = cols < n_emit.unsqueeze(1)
        emitted_p = p[valid]  # only emitted positions pay for their statistics
        toks = step_tokens[valid]
        lp = emitted_p.gather(-1, toks.unsqueeze(-1)).squeeze(-1).clamp_min(MIN_PROB).log().tolist()
        ent = entropy(emitted_p).tolist()
        toks = toks.tolist()
        done = (hit_eos | (rows.n_out + n_emit >= self.max_new_tokens)).tolist()
        rows.n_out.add_(n_emit)
        finished, at = [], 0
        for r, (n, d) in enumerate(zip(n_emit.tolist(), done)):
            ro = self.out[rows.request[r]]
            ro.tokens += toks[at:at + n]
            ro.logprobs += lp[at:at + n]
            ro.entropies += ent[at:at + n]
            at += n
            if d:
                self.finish(rows.request[r], "eos" if toks[at - 1] in self.eos else "length")
                finished.append(r)
        self.stats.tokens += at
        self.stats.entropy_sum += sum(ent)
        self.bar.update(at)
        return finished
