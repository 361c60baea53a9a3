"""Batched ragged generation: plain sampling (`ar`) and speculative decoding with an MTP draft (`spec`,
`spec-greedy`), in one loop, with continuous batching.

Rows: at most `max_batch` requests decode at once. A request joins a free row by a prefill (one forward per
distinct prompt, its KV entries copied into every row that samples that prompt, so N samples of one prompt pay
for one prefill) and its first token is sampled from the prefill. When a row finishes (EOS or its token limit)
the next waiting request takes it; once the queue is empty, finished rows are dropped.

One step, for every active row at once:
  0. K       a fixed draft length, or "auto": the K that maximises expected tokens per second from the probed
             step cost and the acceptance of past steps (bebop.engine.draft_len). K = 0 is a plain decoding step.
  1. draft   (K > 0) the MTP first catches up on the positions the target committed since it last ran (using
             the target's hidden states), which yields draft 1; then it recurses on its own hidden states for
             drafts 2..K. `spec` samples x_i ~ q_i; `spec-greedy` takes x_i = argmax q_i. Plain steps (K = 0)
             only pile their positions up for the MTP, fed to it when drafting resumes: a row that finishes
             before drafting again never pays for them, and a catch-up over many positions costs less per
             position than over one (its memory is bounded as the caches' are: one feature vector a position).
  2. verify  the target scores [pending token, x_1..x_K] in one forward: p_1..p_{K+1}.
  3. accept  rejection sampling (bebop.sampling) keeps a prefix of the drafts plus one corrected/bonus token.
  4. commit  each row advances its own KV-cache length by its own count; rejected entries are simply
             overwritten later. Rows that hit EOS or the token limit finish (`on_finish` is called).
`ar` is the same loop with K = 0: verify one token, sample from p_1.
In the code: `speculative_step` is steps 1-4, read top to bottom; `Scheduler` owns the requests (prefill,
admission, recording, finishing, compaction) and `Rows` what each row carries between steps; `generate` chooses
K (step 0), feeds the MTP what plain steps piled up, and counts.
Every request draws its uniforms from its own generator, a fixed number per step for a given K, so with a
fixed K a request's output depends neither on the other rows nor on when it joined.
Caches hold prompt + max_new_tokens plus one step's drafts where the model's context allows; at the end of
the context K shrinks instead, so a request that fits the context never fails.
"""

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

import torch
from tqdm import tqdm

from bebop.engine.draft_len import Acceptance, bucket, choose_draft_len, step_costs_for
from bebop.errors import BebopError
from bebop.models import compiled
from bebop.models.decoder import Decoder
from bebop.drafts.base import Draft as MTP, target_forward
from bebop.sampling import SamplingParams, entropy, probabilities, rejection_sample_uniform, sample, token_stats

MODES = ("ar", "spec", "spec-greedy")
DEFAULT_MAX_DRAFT_LEN = 4  # the largest K "auto" may pick


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
    def mean_draft_len(self) -> float | None:  # K per speculative step (varies under draft_len="auto")
        return self.drafted / self.steps if self.steps else None

    @property
    def mean_entropy(self) -> float | None:
        return self.entropy_sum / self.tokens if self.tokens else None

    def summary(self) -> dict:
        return {"acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance, "mean_entropy": self.mean_entropy,
                "mean_draft_len": self.mean_draft_len, "drafted": self.drafted, "accepted": self.accepted,
                "steps": self.steps, "tokens": self.tokens}


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


def compaction(n_rows: int, gone: set[int]) -> torch.Tensor:
    """The rows to keep, in their new order, when the rows `gone` finish: a surviving row keeps its place
    unless it lies beyond the new batch size, in which case it fills a finished row's slot (so the KV cache
    copies one row per finished row, not the whole batch; KVCache.keep_rows)."""
    n = n_rows - len(gone)
    movers = [r for r in range(n, n_rows) if r not in gone]
    return torch.tensor([movers.pop() if r in gone else r for r in range(n)], dtype=torch.long)


def draft(mtp: MTP, tokens, feats, count, cache, K, params, greedy, u):
    """Catch up on `count` [B] new positions per row (their tokens and the target's unprojected features, as
    target_forward returns them), then draft K tokens recursively.
    Returns draft tokens [B, K] (target vocabulary ids), the distributions to verify them against [B, K, Vd]
    (one-hot when greedy) and the MTP's own distributions [B, K, Vd], both over the draft vocabulary."""
    rows = torch.arange(tokens.shape[0])
    h = mtp(tokens, mtp.features(feats), cache)[rows, count - 1]
    cache.lengths += count
    drafts, verify_q, q_own = [], [], []
    for k in range(K):
        if k > 0:  # recursion: the previous draft token with the MTP's own previous hidden state
            h = mtp(drafts[-1].unsqueeze(1), h.unsqueeze(1), cache)[:, 0]
            cache.lengths += 1
        q = probabilities(mtp.draft_logits(h), params)
        idx = q.argmax(-1) if greedy else sample(q, u[:, k])
        drafts.append(idx if len(mtp.vocab_ids) == 0 else mtp.vocab_ids[idx])
        q_own.append(q)
        verify_q.append(torch.zeros_like(q).scatter_(-1, idx.unsqueeze(-1), 1.0) if greedy else q)
    cache.lengths -= K - 1  # speculative entries are not committed; the next catch-up overwrites them
    return torch.stack(drafts, 1), torch.stack(verify_q, 1), torch.stack(q_own, 1)


def catch_up(mtp: MTP, tokens, feats, count, cache):
    """Feed the MTP all but the last of each row's pending positions, without drafting: the positions plain
    steps (K = 0) piled up, when drafting resumes. Returns the new, one-long pile."""
    rows = torch.arange(tokens.shape[0])
    mtp(tokens, mtp.features(feats), cache)
    cache.lengths += count - 1
    last = count - 1
    return tokens[rows, last].unsqueeze(1), feats[rows, last].unsqueeze(1), torch.ones_like(count)


@dataclass
class Rows:
    """What each decoding row carries from step to step; row r holds request `request[r]`. The pile is what the
    MTP has yet to see: for each position the target committed since the MTP last ran, the target's features
    there (unprojected, as target_forward returns them) and the token after it."""
    request: list[int]  # the request in each row
    gen: list[torch.Generator]  # that request's generator: every uniform it draws
    n_out: torch.Tensor  # [B] tokens emitted so far
    pending: torch.Tensor  # [B] the last emitted token, not yet seen by the target
    pile_tokens: torch.Tensor  # [B, W]
    pile_feats: torch.Tensor  # [B, W, F]
    pile_count: torch.Tensor  # [B] pile positions in use per row (W >= max)

    @classmethod
    def empty(cls, batch: int, feat_dim: int, dtype) -> "Rows":
        return cls([-1] * batch, [None] * batch, torch.zeros(batch, dtype=torch.long),
                   torch.zeros(batch, dtype=torch.long), torch.zeros(batch, 1, dtype=torch.long),
                   torch.zeros(batch, 1, feat_dim, dtype=dtype), torch.ones(batch, dtype=torch.long))

    def __len__(self) -> int:
        return len(self.request)

    def keep(self, keep: torch.Tensor) -> "Rows":
        return Rows([self.request[r] for r in keep], [self.gen[r] for r in keep], self.n_out[keep],
                    self.pending[keep], self.pile_tokens[keep], self.pile_feats[keep], self.pile_count[keep])

    def commit_pile(self, K: int, step_tokens, feats, num_accepted) -> None:
        """After a step: with drafts, the MTP has seen the drafted positions and must next see the accepted
        ones; after a plain step the one committed position joins the pile."""
        if K:
            self.pile_tokens, self.pile_feats, self.pile_count = step_tokens.clamp_min(0), feats, num_accepted + 1
            return
        if int(self.pile_count.max()) == self.pile_tokens.shape[1]:  # full: twice as wide, a copy per doubling
            self.pile_tokens = torch.cat([self.pile_tokens, torch.zeros_like(self.pile_tokens)], 1)
            self.pile_feats = torch.cat([self.pile_feats, torch.zeros_like(self.pile_feats)], 1)
        rows = torch.arange(len(self))
        self.pile_tokens[rows, self.pile_count] = step_tokens[:, 0]
        self.pile_feats[rows, self.pile_count] = feats[:, 0]
        self.pile_count = self.pile_count + 1


def speculative_step(target: Decoder, mtp: MTP | None, rows: Rows, cache, mcache, K: int, params: SamplingParams,
                     greedy: bool, vocab_ids):
    """One step for every row: draft K tokens, verify them in one target forward, accept a prefix by rejection
    sampling, commit it (K = 0: a plain decoding step). Returns the step's tokens [B, K+1] (-1 past each row's
    accepted drafts and its one corrected or bonus token), num_accepted [B], the target's distributions
    p [B, K+1, V] and the MTP's own q [B, K, Vd] (None without drafts)."""
    B = len(rows)
    # every row draws 2K+1 uniforms from its own generator: K to draft, K to accept, one for the last token
    u = torch.stack([torch.rand(2 * K + 1, generator=g, dtype=torch.float64) for g in rows.gen])  # [B, 2K+1]
    # 1. draft: the MTP catches up on the pile, which yields draft 1, then recurses for drafts 2..K
    q_own = None
    if K:
        width = int(rows.pile_count.max())
        drafts, verify_q, q_own = draft(mtp, rows.pile_tokens[:, :width], rows.pile_feats[:, :width],
                                        rows.pile_count, mcache, K, params, greedy, u[:, :K])
        tokens = torch.cat([rows.pending.unsqueeze(1), drafts], 1)  # [B, K+1]
    else:
        drafts = verify_q = torch.zeros(B, 0, dtype=torch.long)
        tokens = rows.pending.unsqueeze(1)  # [B, 1]
    # 2. verify: the target scores [pending, x_1..x_K] in one forward
    hidden, feats = target_forward(target, mtp, tokens, cache)
    p = probabilities(target.logits(hidden), params)
    # 3. accept
    step_tokens, num_accepted = rejection_sample_uniform(p, verify_q, drafts, u[:, K:2 * K], u[:, 2 * K],
                                                         vocab_ids=vocab_ids)
    # 4. commit: each row's cache advances by its own count; rejected entries are overwritten later
    cache.lengths += num_accepted + 1
    if mtp is not None:
        rows.commit_pile(K, step_tokens, feats, num_accepted)
    rows.pending = step_tokens[torch.arange(B), num_accepted]
    return step_tokens, num_accepted, p, q_own


class Scheduler:
    """The requests and the rows they decode in: prefill (one forward per distinct prompt, a batch ahead),
    admission into free rows (each request's first token sampled from its prefill), recording what each step
    emitted, finishing rows at EOS or the token limit, and compaction once no request waits."""

    def __init__(self, target: Decoder, mtp: MTP | None, prompts, max_new_tokens: int, params: SamplingParams,
                 seed, cache, mcache, eos: set[int], acceptance: Acceptance | None, on_finish, progress: bool,
                 mode: str):
        self.target, self.mtp, self.prompts, self.params = target, mtp, prompts, params
        self.max_new_tokens, self.cache, self.mcache, self.acceptance = max_new_tokens, cache, mcache, acceptance
        self.eos, self.eos_t = eos, torch.tensor(sorted(eos), dtype=torch.long)
        self.on_finish = on_finish
        N, self.batch = len(prompts), cache.lengths.shape[0]
        self.request_gens = row_generators(seed, N)
        self.out = [Rollout(i) for i in range(N)]
        self.stats = SpecStats()
        self.queue = deque(range(N))
        self.waiting = Counter(tuple(p) for p in prompts)
        self.prefilled = {}  # prompt -> (cache, MTP cache, row, the MTP's input at its last position, p of token 1)
        feat_dim = target.cfg.dim * (len(mtp.feature_layers) if mtp is not None and mtp.feature_layers else 1)
        self.rows = Rows.empty(self.batch, feat_dim, target.embed.weight.dtype)
        self.bar = tqdm(total=N * max_new_tokens, desc=f"generate {mode}", unit="tok", disable=not progress,
                        leave=False)

    def finish(self, i: int, reason: str) -> None:
        self.out[i].stop_reason = reason
        if self.on_finish is not None:
            self.on_finish(i, self.out[i])

    def prefill(self, requests) -> None:
        """Prefill, in one forward, the distinct prompts among `requests` that are not prefilled yet."""
        target, mtp = self.target, self.mtp
        new = list(dict.fromkeys(key for key in (tuple(self.prompts[i]) for i in requests) if key not in self.prefilled))
        if not new:
            return
        lens = torch.tensor([len(p) for p in new])
        tokens = right_pad(new)  # a row's padding is never attended to
        tc = target.new_cache(len(new), tokens.shape[1])
        hidden, feats = target_forward(target, mtp, tokens, tc)
        tc.lengths = lens.clone()
        last = hidden[torch.arange(len(new)), lens - 1]
        p = probabilities(target.logits(last), self.params)
        tmc = None
        if mtp is not None:  # the MTP sees every prompt position but the last now; the last comes with token 1
            tmc = mtp.new_cache(len(new), tokens.shape[1])
            if tokens.shape[1] > 1:
                mtp(tokens[:, 1:], mtp.features(feats[:, :-1]), tmc)
            tmc.lengths = lens - 1
        last_feats = feats[torch.arange(len(new)), lens - 1]
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
        tok = int(sample(p, torch.rand(1, generator=g, dtype=torch.float64)[0]))
        rows = self.rows
        rows.request[row], rows.gen[row], rows.n_out[row], rows.pending[row] = i, g, 1, tok
        rows.pile_tokens[row, 0], rows.pile_feats[row, 0], rows.pile_count[row] = tok, last, 1
        ro = self.out[i]
        ro.tokens.append(tok)
        ro.logprobs.append(float(p[tok].clamp_min(1e-30).log()))
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
        cols = torch.arange(step_tokens.shape[1]).unsqueeze(0)
        is_eos = torch.isin(step_tokens, self.eos_t) & (cols < n_emit.unsqueeze(1))
        hit_eos = is_eos.any(1)
        n_emit = torch.where(hit_eos, is_eos.long().argmax(1) + 1, n_emit)
        valid = cols < n_emit.unsqueeze(1)
        emitted_p = p[valid]  # only emitted positions pay for their statistics
        toks = step_tokens[valid]
        lp = emitted_p.gather(-1, toks.unsqueeze(-1)).squeeze(-1).clamp_min(1e-30).log().tolist()
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


@torch.inference_mode()
def generate(target: Decoder, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = SamplingParams(),
             mode: str = "ar", mtp: MTP | None = None, draft_len: int | str = 3, seed: int | list[int] = 0,
             eos_ids: list[int] | None = None, trace: bool = False, progress: bool = False, *,
             max_batch: int | None = None, max_draft_len: int = DEFAULT_MAX_DRAFT_LEN,
             on_finish: Callable[[int, Rollout], None] | None = None) -> Generation:
    """Generate up to `max_new_tokens` per prompt (token-id lists). `eos_ids` stop a row (default: the
    model's); pass [] to ignore EOS (benchmarks). `seed` is one base seed or one seed per request.
    draft_len: K, or "auto" (K in 0..max_draft_len chosen every step by cost, bebop.engine.draft_len).
    max_batch: rows decoded at once (None: all requests); a finished row takes the next waiting request.
    on_finish(index, rollout) is called once per request as soon as it finishes.
    With a fixed K a request's tokens depend only on its prompt, seed and the settings; with "auto" only
    their distribution is fixed (the target's): the exact sample also depends on the K chosen per step."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    auto = draft_len == "auto"
    K_max = max_draft_len if auto else draft_len
    if isinstance(K_max, bool) or not isinstance(K_max, int) or K_max < 0:
        raise ValueError(f"draft length must be an int >= 0 or 'auto' (with max_draft_len >= 0), got "
                         f"{draft_len!r}{f' with max_draft_len={max_draft_len!r}' if auto else ''}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or min(map(len, prompts)) == 0:
        raise ValueError("every prompt needs at least one token")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")
    if isinstance(seed, list) and len(seed) != len(prompts):
        raise ValueError(f"got {len(seed)} seeds for {len(prompts)} prompts")
    spec = mode != "ar" and K_max > 0
    if spec and mtp is None:
        raise ValueError(f"mode '{mode}' needs an MTP module")
    if not spec:
        K_max, mtp = 0, None
    context = target.rope_cos.shape[0]
    need = max(len(p) for p in prompts) + max_new_tokens
    if need > context:
        raise BebopError(f"a prompt plus max_new_tokens is {need} tokens, beyond the model's context of {context}")
    # caches hold prompt + max_new_tokens, plus room for one step's drafts where the context allows it; near
    # the end of the context K shrinks instead, so a request that fits the context never fails
    max_len = min(need + 1 + K_max, context)
    B = len(prompts) if max_batch is None else min(len(prompts), max_batch)
    if target.compiled:  # every graph this generation meets, compiled before it starts (auto K's cost probe
        # runs a batch bucket's rows, which may be more than B)
        compiled.warm_up(target, bucket(B) if auto and spec else B, K_max + 1,
                         mtp.feature_layers if spec and mtp.feature_layers else ())
    cache = target.new_cache(B, max_len)
    mcache = mtp.new_cache(B, max_len) if spec else None
    costs = step_costs_for(target, mtp, K_max) if auto and spec else None  # probed, then measured
    acceptance = Acceptance(K_max, B, prior_spread=costs.row_spread) if auto and spec else None
    vocab_ids = mtp.vocab_ids if spec and len(mtp.vocab_ids) else None
    sched = Scheduler(target, mtp, prompts, max_new_tokens, params, seed, cache, mcache,
                      set(target.eos_ids if eos_ids is None else eos_ids), acceptance, on_finish, progress, mode)
    stats = sched.stats
    stats.draft_len, stats.accepted_at = K_max, [0] * K_max
    traced = []

    free = sched.fill(range(B))
    while not free or sched.compact(free):
        rows = sched.rows
        n_rows = len(rows)
        started = time.perf_counter()
        # 0. draft length. Everything here is known before the step: the caches' room, past acceptance and
        # the measured cost, never what the target computes in this step, so the step stays exact for any K.
        K = min(K_max, max_len - 1 - int(cache.lengths.max()))  # the target writes positions len..len+K
        width = int(rows.pile_count.max()) if spec else 0  # the pile's used width: what a catch-up writes per row
        if spec and int(mcache.lengths.max()) + width > max_len:
            K = 0  # the MTP's catch-up would not fit either (only at the very end of the context)
        if auto and K > 0:
            K = min(K, int((max_new_tokens - rows.n_out).max()) - 1)  # tokens past every row's limit are wasted
            if K > 0 and costs.wants_baseline(n_rows):  # plain steps first: what drafting must beat, measured
                K = 0
            elif K > 0:  # once no request waits for a row, rows that drift apart leave a tail of small steps;
                # and drafting after plain steps first feeds the MTP what they piled up
                drain = None if sched.queue else (acceptance.row_alphas(), acceptance.row_spread(),
                                                  max_new_tokens - rows.n_out, costs(1),
                                                  costs.catch_up_seconds(n_rows * (width - 1)))
                K = choose_draft_len(acceptance.alphas(), costs(n_rows), K, drain)
        # the pile goes to the MTP (all but each row's last position, which comes with the drafting) when this
        # step drafts after plain steps; timed apart: a cost of the plain steps before. Never while K = 0: a
        # catch-up no draft follows (rows finishing on plain steps) is work thrown away
        fed = 0.0
        if K and width > K_max + 1:  # (it fits the MTP's cache: K would be 0 otherwise)
            t0 = time.perf_counter()
            rows.pile_tokens, rows.pile_feats, rows.pile_count = catch_up(
                mtp, rows.pile_tokens[:, :width], rows.pile_feats[:, :width], rows.pile_count, mcache)
            fed = time.perf_counter() - t0
            if costs is not None:
                costs.record_catch_up(n_rows * (width - 1), fed)

        step_tokens, num_accepted, p, q_own = speculative_step(target, mtp, rows, cache, mcache, K, params,
                                                               mode == "spec-greedy", vocab_ids)

        if acceptance is not None:
            acceptance.update(K, num_accepted)
        if K:  # plain decoding makes no speculative steps
            stats.steps += n_rows
            stats.drafted += K * n_rows
            stats.accepted += int(num_accepted.sum())
            for i in range(K):
                stats.accepted_at[i] += int((num_accepted > i).sum())
            if trace:
                examined = torch.arange(K).unsqueeze(0) <= num_accepted.unsqueeze(1)  # reached in the walk
                ts = token_stats(p[:, :K], mtp.full_vocab(q_own))
                r_idx, d_idx = examined.nonzero(as_tuple=True)
                traced.append({"row": torch.tensor(rows.request)[r_idx], "depth": d_idx,
                               "accepted": num_accepted[r_idx] > d_idx,
                               **{k: v[r_idx, d_idx] for k, v in ts.items()}})
        finished = sched.record(step_tokens, num_accepted, p)  # (its .tolist() waits for an accelerator)
        if costs is not None:
            costs.record(n_rows, K, time.perf_counter() - started - fed)
        free = sched.fill(finished)
    sched.bar.close()
    if acceptance is not None:  # what the next generation starts from (RL rollouts: the same tasks again)
        costs.row_spread = acceptance.spread
    table = None
    if trace and traced:
        table = {k: torch.cat([t[k] for t in traced]).numpy() for k in traced[0]}
    return Generation(sched.out, stats, table)
