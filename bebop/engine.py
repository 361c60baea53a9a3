"""Batched ragged generation: plain sampling (`ar`) and speculative decoding with an MTP draft (`spec`,
`spec-greedy`), in one loop.

One step, for every active row at once:
  1. draft   (spec modes) the MTP first catches up on the positions the target committed last step (using the
             target's hidden states), which yields draft 1; then it recurses on its own hidden states for
             drafts 2..K. `spec` samples x_i ~ q_i; `spec-greedy` takes x_i = argmax q_i.
  2. verify  the target scores [pending token, x_1..x_K] in one forward: p_1..p_{K+1}.
  3. accept  rejection sampling (bebop.sampling) keeps a prefix of the drafts plus one corrected/bonus token.
  4. commit  each row advances its own KV-cache length by its own count; rejected entries are simply
             overwritten later. Rows that hit EOS or the token limit leave the batch.
`ar` is the same loop with K = 0: verify one token, sample from p_1.
Every row draws its uniforms from its own generator, a fixed number per step, so a row's output does not
depend on the other rows.
"""

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from bebop.models.decoder import Decoder
from bebop.mtp import MTP
from bebop.sampling import SamplingParams, probabilities, rejection_sample_uniform, sample, token_stats

MODES = ("ar", "spec", "spec-greedy")


@dataclass
class Rollout:
    prompt_index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # log p(token) under the target's sampling distribution
    entropies: list[float] = field(default_factory=list)  # entropy (nats) of that distribution
    stop_reason: str = "length"  # "eos" or "length"


@dataclass
class SpecStats:
    """Counters named as vLLM names them (NOTES.md section 4)."""
    draft_len: int = 0
    steps: int = 0  # target verification forwards (speculative steps)
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # steps in which draft i was accepted
    tokens: int = 0
    entropy_sum: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.steps for a in self.accepted_at] if self.steps else []

    @property
    def mean_entropy(self) -> float | None:
        return self.entropy_sum / self.tokens if self.tokens else None

    def summary(self) -> dict:
        return {"acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance, "mean_entropy": self.mean_entropy,
                "drafted": self.drafted, "accepted": self.accepted, "steps": self.steps, "tokens": self.tokens}


@dataclass
class Generation:
    rollouts: list[Rollout]
    stats: SpecStats
    trace: dict | None = None  # per examined draft position: token_stats columns, row, depth, accepted


def row_generators(seed: int | list[int], batch: int) -> list[torch.Generator]:
    seeds = seed if isinstance(seed, list) else [seed * 1_000_003 + b for b in range(batch)]
    return [torch.Generator().manual_seed(int(s) % 2**64) for s in seeds]  # any int seed; torch takes 64 bits


def right_pad(seqs: list[list[int]], pad: int = 0) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def entropy(probs: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(probs, probs).sum(-1)


def draft(mtp: MTP, tokens, hidden, count, cache, K, params, greedy, u):
    """Catch up on `count` [B] new positions per row, then draft K tokens recursively.
    Returns draft tokens [B, K], the draft distributions over the full vocabulary [B, K, V] used for
    verification (one-hot when greedy), and the MTP's own distributions [B, K, V]."""
    rows = torch.arange(tokens.shape[0])
    h = mtp(tokens, hidden, cache)[rows, count - 1]
    cache.lengths += count
    drafts, verify_q, q_full = [], [], []
    for k in range(K):
        if k > 0:  # recursion: the previous draft token with the MTP's own previous hidden state
            h = mtp(drafts[-1].unsqueeze(1), h.unsqueeze(1), cache)[:, 0]
            cache.lengths += 1
        q = probabilities(mtp.draft_logits(h), params)
        idx = q.argmax(-1) if greedy else sample(q, u[:, k])
        q = mtp.full_vocab(q)
        tok = idx if len(mtp.vocab_ids) == 0 else mtp.vocab_ids[idx]
        drafts.append(tok)
        q_full.append(q)
        verify_q.append(torch.zeros_like(q).scatter_(-1, tok.unsqueeze(-1), 1.0) if greedy else q)
    cache.lengths -= K - 1  # speculative entries are not committed; the next catch-up overwrites them
    return torch.stack(drafts, 1), torch.stack(verify_q, 1), torch.stack(q_full, 1)


@torch.inference_mode()
def generate(target: Decoder, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = SamplingParams(),
             mode: str = "ar", mtp: MTP | None = None, draft_len: int = 3, seed: int | list[int] = 0,
             eos_ids: list[int] | None = None, trace: bool = False, progress: bool = False,
             on_finish=None) -> Generation:
    """Generate up to `max_new_tokens` per prompt (token-id lists). `eos_ids` stop a row (default: the
    model's); pass [] to ignore EOS (benchmarks). `seed` is one base seed or one seed per row.
    `on_finish(index, rollout)` is called once per prompt as soon as its rollout is complete (streaming)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    if draft_len < 0:
        raise ValueError(f"draft length must be >= 0, got {draft_len}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or min(map(len, prompts)) == 0:
        raise ValueError("every prompt needs at least one token")
    spec = mode != "ar" and draft_len > 0
    if spec and mtp is None:
        raise ValueError(f"mode '{mode}' needs an MTP module")
    K = draft_len if spec else 0
    eos_set = set(getattr(target, "eos_ids", []) if eos_ids is None else eos_ids)
    B = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    max_len = int(lengths.max()) + max_new_tokens + K + 2
    cache = target.new_cache(B, max_len)
    mcache = mtp.new_cache(B, max_len) if spec else None
    gens = row_generators(seed, B)
    out = [Rollout(i) for i in range(B)]
    stats = SpecStats(draft_len=K, accepted_at=[0] * K)
    traced = []
    active = torch.arange(B)  # original row index of each batch row
    bar = tqdm(total=B * max_new_tokens, desc=f"generate {mode}", unit="tok", disable=not progress, leave=False)

    # prefill: every row's prompt at once, right-padded; a row's padding is never attended to
    tokens = right_pad(prompts)
    hidden = target(tokens, cache)
    cache.lengths = lengths.clone()
    rows = torch.arange(B)
    p = probabilities(target.logits(hidden[rows, lengths - 1]), params).unsqueeze(1)
    step_tokens = sample(p[:, 0], torch.stack([torch.rand(1, generator=g, dtype=torch.float64) for g in gens])[:, 0])
    step_tokens, num_accepted = step_tokens.unsqueeze(1), torch.zeros(B, dtype=torch.long)
    # what the MTP has yet to see: for each committed target position, its hidden state and the token after it
    catch_tokens = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)
    catch_tokens[rows, lengths - 1] = step_tokens[:, 0]
    catch_hidden, catch_count = hidden, lengths.clone()

    while True:
        # -- record what this step emitted (one batched computation, then plain lists); find rows that are done
        lp = p.gather(-1, step_tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1).clamp_min(1e-30).log().tolist()
        ent = entropy(p).tolist()
        finished, before = [], stats.tokens
        for r, (toks, n) in enumerate(zip(step_tokens.tolist(), (num_accepted + 1).tolist())):
            ro = out[int(active[r])]
            for i in range(n):
                ro.tokens.append(toks[i])
                ro.logprobs.append(lp[r][i])
                ro.entropies.append(ent[r][i])
                stats.tokens += 1
                stats.entropy_sum += ent[r][i]
                if toks[i] in eos_set or len(ro.tokens) >= max_new_tokens:
                    ro.stop_reason = "eos" if toks[i] in eos_set else "length"
                    finished.append(r)
                    if on_finish is not None:
                        on_finish(int(active[r]), ro)
                    break
        bar.update(stats.tokens - before)
        if finished:
            done = set(finished)
            keep = torch.tensor([r for r in range(len(active)) if r not in done], dtype=torch.long)
            if len(keep) == 0:
                break
            active, gens = active[keep], [gens[int(r)] for r in keep]
            step_tokens, num_accepted = step_tokens[keep], num_accepted[keep]
            catch_tokens, catch_hidden, catch_count = catch_tokens[keep], catch_hidden[keep], catch_count[keep]
            cache.keep_rows(keep)
            if spec:
                mcache.keep_rows(keep)
        n_rows = len(active)
        rows = torch.arange(n_rows)
        pending = step_tokens[rows, num_accepted]  # the last emitted token, not yet seen by the target
        u = torch.stack([torch.rand(2 * K + 1, generator=g, dtype=torch.float64) for g in gens])

        # -- 1. draft
        if spec:
            drafts, verify_q, q_full = draft(mtp, catch_tokens, catch_hidden, catch_count, mcache, K, params,
                                             mode == "spec-greedy", u[:, :K])
            inp = torch.cat([pending.unsqueeze(1), drafts], 1)
        else:
            drafts = verify_q = torch.zeros(n_rows, 0, dtype=torch.long)
            inp = pending.unsqueeze(1)
        # -- 2. verify
        hidden = target(inp, cache)
        p = probabilities(target.logits(hidden), params)
        # -- 3. accept
        step_tokens, num_accepted = rejection_sample_uniform(p, verify_q, drafts, u[:, K:2 * K], u[:, 2 * K])
        # -- 4. commit
        cache.lengths += num_accepted + 1
        if spec:  # plain decoding makes no speculative steps
            stats.steps += n_rows
            stats.drafted += K * n_rows
            stats.accepted += int(num_accepted.sum())
            for i in range(K):
                stats.accepted_at[i] += int((num_accepted > i).sum())
            catch_tokens, catch_hidden, catch_count = step_tokens.clamp_min(0), hidden, num_accepted + 1
            if trace:
                examined = torch.arange(K).unsqueeze(0) <= num_accepted.unsqueeze(1)  # reached in the walk
                ts = token_stats(p[:, :K], q_full)
                r_idx, d_idx = examined.nonzero(as_tuple=True)
                traced.append({"row": active[r_idx], "depth": d_idx,
                               "accepted": num_accepted[r_idx] > d_idx,
                               **{k: v[r_idx, d_idx] for k, v in ts.items()}})
    bar.close()
    table = None
    if trace and traced:
        table = {k: torch.cat([t[k] for t in traced]).numpy() for k in traced[0]}
    return Generation(out, stats, table)
