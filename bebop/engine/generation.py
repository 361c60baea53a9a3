"""Batched ragged generation (`generate`): plain sampling (`ar`) and speculative decoding with a draft (`spec`,
`spec-greedy`), in one loop, with continuous batching.

generate checks its arguments, sets up the caches (and, for "auto", the step costs and acceptance estimates),
then loops: 0. choose the step's draft length K (a fixed one, or under "auto" the K that maximises expected
tokens per second, bebop.engine.draft_len; K = 0 is a plain decoding step), feed the draft what plain steps
piled up, 1-4. one speculative step (bebop.engine.step: draft, verify, accept, commit), record what each row
emitted and refill finished rows (bebop.engine.scheduler), count (bebop.engine.stats).
Caches hold prompt + max_new_tokens plus one step's drafts where the model's context allows; at the end of the
context K shrinks instead, so a request that fits the context never fails.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from bebop.drafts.base import Draft, draft_or_old_mtp
from bebop.drafts.history import NO_TOKEN, HistoryDraft, Proposal, Recording
from bebop.drafts.hybrid import MODEL_PRIOR, HybridDraft, choose_sources, history_of, model_of
from bebop.engine.modes import MODES  # noqa: F401 (here too: engine.generation.MODES)
from bebop.engine.draft_len import (DRAFT_MARGIN, Acceptance, StepCosts, bucket, choose_draft_len, choose_row_draft_lens,
                                    step_costs_for)
from bebop.engine.scheduler import Scheduler
from bebop.engine.stats import SpecStats
from bebop.engine.step import Rows, catch_up, speculative_step
from bebop.errors import BebopError
from bebop.models import compiled
from bebop.models.decoder import Decoder
from bebop.sampling import SamplingParams, token_stats

DEFAULT_MAX_DRAFT_LEN = 4  # the largest K "auto" may pick


@dataclass
class Rollout:
    prompt_index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # log p(token) under the target's sampling distribution
    entropies: list[float] = field(default_factory=list)  # entropy (nats) of that distribution
    stop_reason: str = "length"  # "eos" or "length"


@dataclass
class Generation:
    rollouts: list[Rollout]
    stats: SpecStats
    trace: dict | None = None  # per examined draft position: token_stats columns, row, depth, accepted


@dataclass
class Decoding:
    """What a generate call sets up once and its steps share."""
    sched: Scheduler
    cache: object  # the target's KV cache, [B] rows of max_len positions
    mcache: object | None  # the draft's (None without drafts)
    max_len: int
    K_max: int  # the largest K a step may draft (0: plain decoding)
    costs: StepCosts | None  # under "auto": probed, then measured
    acceptance: Acceptance | None  # under "auto": past steps' acceptance
    vocab_ids: torch.Tensor | None  # the draft vocabulary's target ids (None: the full vocabulary)
    packed: bool  # whether rows verifying fewer drafts than others save the padding's work (Decoder.packs)
    history_costs: StepCosts | None = None  # a hybrid's, under "auto": its steps that run no model drafting


def check_arguments(target: Decoder, prompts, max_new_tokens: int, mode: str, mtp: Draft | HistoryDraft | None, draft_len,
                    seed, max_batch: int | None, max_draft_len: int) -> tuple[int, bool]:
    """Refuse what generate cannot do; returns the largest K a step may draft and whether steps draft."""
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
        raise ValueError(f"mode '{mode}' needs a draft: pass draft= (e.g. bebop.default_draft(model)), or mode='ar' "
                         "for plain sampling")
    context = target.rope_cos.shape[0]
    need = max(len(p) for p in prompts) + max_new_tokens
    if need > context:
        raise BebopError(f"a prompt plus max_new_tokens is {need} tokens, beyond the model's context of {context}")
    return (K_max, True) if spec else (0, False)


def set_up(target: Decoder, mtp: Draft | None, prompts, max_new_tokens: int, params: SamplingParams, mode: str,
           K_max: int, auto: bool, seed, eos_ids, max_batch: int | None, on_finish, progress: bool,
           history: HistoryDraft | None = None) -> Decoding:
    """The caches, the cost and acceptance estimates of "auto" and the scheduler, for steps of up to K_max
    drafts (mtp is None for plain decoding and for a history draft)."""
    # caches hold prompt + max_new_tokens, plus room for one step's drafts where the context allows it; near
    # the end of the context K shrinks instead, so a request that fits the context never fails
    max_len = min(max(len(p) for p in prompts) + max_new_tokens + 1 + K_max, target.rope_cos.shape[0])
    B = len(prompts) if max_batch is None else min(len(prompts), max_batch)
    if target.compiled:  # every graph this generation meets, compiled before it starts (auto K's cost probe
        # runs a batch bucket's rows, which may be more than B)
        compiled.warm_up(target, bucket(B) if auto else B, K_max + 1,
                         mtp.feature_layers if mtp is not None and mtp.feature_layers else ())
    cache = target.new_cache(B, max_len)
    mcache = mtp.new_cache(B, max_len) if mtp is not None else None
    costs = step_costs_for(target, mtp or history, K_max) if auto else None
    # a model draft's acceptance is learnt from its past steps; a history draft states its own (propose)
    acceptance = Acceptance(K_max, B, prior_spread=costs.row_spread) if auto and mtp is not None else None
    vocab_ids = mtp.vocab_ids if mtp is not None and len(mtp.vocab_ids) else None
    rollouts = [Rollout(i) for i in range(len(prompts))]
    sched = Scheduler(target, mtp, prompts, rollouts, max_new_tokens, params, seed, cache, mcache,
                      set(target.eos_ids if eos_ids is None else eos_ids), acceptance, on_finish, progress, mode)
    sched.stats.draft_len, sched.stats.accepted_at = K_max, [0] * K_max
    history_costs = step_costs_for(target, history, K_max) if auto and history is not None and mtp is not None else None
    return Decoding(sched, cache, mcache, max_len, K_max, costs, acceptance, vocab_ids, target.packs(cache),
                    history_costs)


def choose_step_draft_len(d: Decoding, rows: Rows, max_new_tokens: int) -> tuple[int, int, torch.Tensor | None, int]:
    """0. The step's draft length K, the used width of the draft's pile, where rows draft their own numbers
    each row's k_r <= K [B] (None: K for every row), and the most the caches leave room for. Everything here is
    known before the step: the caches' room, past acceptance and the measured cost, never what the target
    computes in this step, so the step stays exact for any K."""
    K = min(d.K_max, d.max_len - 1 - int(d.cache.lengths.max()))  # the target writes positions len..len+K
    width = int(rows.pile_count.max()) if d.mcache is not None else 0  # what a catch-up writes per row
    if d.mcache is not None and int(d.mcache.lengths.max()) + width > d.max_len:
        K = 0  # the MTP's catch-up would not fit either (only at the very end of the context)
    room, lens = K, None
    if d.acceptance is not None and d.costs is not None and K > 0:  # (a history draft chooses from its proposals)
        n_rows = len(rows)
        K = min(K, int((max_new_tokens - rows.n_out).max()) - 1)  # tokens past every row's limit are wasted
        if K > 0 and d.costs.wants_baseline(n_rows):  # plain steps first: what drafting must beat, measured
            K = 0
        elif K > 0:  # drafting after plain steps first feeds the MTP what they piled up (the backlog)
            backlog = d.costs.catch_up_seconds(n_rows * (width - 1))
            drain = (d.acceptance.row_alphas(), d.acceptance.row_spread(), max_new_tokens - rows.n_out,
                     d.costs(1), backlog)
            if d.sched.queue:  # rows are refilled: the K with the least time per token
                K = choose_draft_len(d.acceptance.alphas(), d.costs(n_rows), K)
            elif not d.packed:  # a padded verify costs every row K drafts: one K for all
                K = choose_draft_len(d.acceptance.alphas(), d.costs(n_rows), K, drain)
            else:  # the batch drains: each row its own k_r, which the rows that would finish last need most
                row_alphas, row_spread, remaining, fixed_costs, _ = drain
                per_row = choose_row_draft_lens(row_alphas, remaining, d.costs(n_rows), fixed_costs, K, row_spread,
                                                backlog)
                K = int(per_row.max())
                lens = torch.from_numpy(per_row) if K and (per_row != K).any() else None
    return K, width, lens, room


def feed_pile(d: Decoding, mtp: Draft | None, rows: Rows, K: int, width: int) -> float:
    """The pile goes to the MTP (all but each row's last position, which comes with the drafting) when this
    step drafts after plain steps; timed apart, a cost of the plain steps before. Never while K = 0: a catch-up
    no draft follows (rows finishing on plain steps) is work thrown away. Returns its seconds."""
    if not (K and width > d.K_max + 1):  # (it fits the MTP's cache: K would be 0 otherwise)
        return 0.0
    t0 = time.perf_counter()
    rows.pile_tokens, rows.pile_feats, rows.pile_count = catch_up(
        mtp, rows.pile_tokens[:, :width], rows.pile_feats[:, :width], rows.pile_count, d.mcache)
    fed = time.perf_counter() - t0
    if d.costs is not None:
        d.costs.record_catch_up(len(rows) * (width - 1), fed)
    return fed


def trace_step(mtp: Draft, rows: Rows, K: int, num_accepted, p, q_own, lens=None) -> dict:
    """token_stats of every draft position the acceptance walk examined, with its row, depth and outcome."""
    depth = torch.arange(K, device=p.device).unsqueeze(0)
    examined = depth <= num_accepted.unsqueeze(1)  # [B, K] reached in the walk
    if lens is not None:  # (a row's drafts past its own length were never verified)
        examined &= depth < lens.to(p.device).unsqueeze(1)
    ts = token_stats(p[:, :K], mtp.full_vocab(q_own))
    r_idx, d_idx = examined.nonzero(as_tuple=True)
    return {"row": torch.tensor(rows.request, device=r_idx.device)[r_idx], "depth": d_idx, "accepted": num_accepted[r_idx] > d_idx,
            **{k: v[r_idx, d_idx] for k, v in ts.items()}}


def history_proposal(history: HistoryDraft, sched: Scheduler, rows: Rows, K: int, max_new_tokens: int,
                     costs: StepCosts | None) -> tuple[tuple[torch.Tensor, torch.Tensor], list]:
    """Each row's drafts from the history (at most K, and none past its token limit): drafts [B, k] padded with
    NO_TOKEN to the longest row's k and each row's own length [B]; and each row's drafts' kinds
    (Proposal.kinds, for HistoryDraft.observe). Under "auto" (`costs`) each row verifies only the drafts worth
    their cost (drafts_worth_verifying); as under auto for a model's drafts, plain steps come first (the
    baseline)."""
    room = (max_new_tokens - 1 - rows.n_out).clamp(0, K).tolist()
    proposed = [history.propose(sched.prompts[i], sched.out[i].tokens, k) for i, k in zip(rows.request, room)]
    keep = [len(p.tokens) for p in proposed]
    if costs is not None and any(keep):
        keep = [0] * len(rows) if costs.wants_baseline(len(rows)) else \
            drafts_worth_verifying([p.chances for p in proposed], costs, len(rows))
    lens = torch.tensor(keep, dtype=torch.long)
    drafts = torch.full((len(rows), int(lens.max())), NO_TOKEN, dtype=torch.long)
    for r, (p, k) in enumerate(zip(proposed, keep)):
        drafts[r, :k] = torch.tensor(p.tokens[:k], dtype=torch.long)
    dev = rows.pending.device
    return (drafts.to(dev), lens.to(dev)), [p.kinds[:k] for p, k in zip(proposed, keep)]


def hybrid_plan(d: Decoding, history: HistoryDraft, rows: Rows, K: int, lens: torch.Tensor | None, room: int,
                max_new_tokens: int):
    """A hybrid draft's step (bebop.drafts.hybrid): each row's proposal from the history (up to `room`, none
    past its token limit) against the trained draft's plan (K, lens), the row drafting from the source that
    promises more. The trained draft's promise: its running acceptance per depth under auto, else MODEL_PRIOR
    per depth. Where the trained draft's plan is a plain step, the history's drafts are kept only where they pay
    for the drafting step (drafts_worth_verifying). Returns K, every row's length [B] (None: K each), the
    history's rows (drafts [B, K] and a mask [B]; None if no row takes them) and their kinds (for observe)."""
    B = len(rows)
    room_rows = (max_new_tokens - 1 - rows.n_out).clamp(0, room).tolist()
    proposed = [history.propose(d.sched.prompts[i], d.sched.out[i].tokens, k) for i, k in zip(rows.request, room_rows)]
    model_lens = [K] * B if lens is None else lens.tolist()
    alphas = d.acceptance.row_alphas().numpy() if d.acceptance is not None else np.full((B, max(room, 1)), MODEL_PRIOR)
    chain = np.cumprod(alphas, -1)  # [B, K_max] the chance that the trained draft's drafts 1..j are all accepted
    from_history = choose_sources(proposed, chain, model_lens)
    costs = d.history_costs if d.history_costs is not None else d.costs  # (a step without the model's drafting)
    if K and costs is not None and any(from_history) and not model_pays(proposed, from_history, chain, model_lens,
                                                                        d.costs, costs, B):
        K, model_lens = 0, [0] * B  # the history drafts this step alone, as where the trained draft plans none
    if K == 0 and costs is not None and any(from_history):  # drafting only for the history: worth its cost?
        worth = [0] * B if costs.wants_baseline(B) else \
            drafts_worth_verifying([p.chances if h else [] for p, h in zip(proposed, from_history)], costs, B)
        proposed = [Proposal(p.tokens[:k], p.chances[:k], p.kinds[:k]) for p, k in zip(proposed, worth)]
        from_history = [h and k > 0 for h, k in zip(from_history, worth)]
    if not any(from_history):  # (K is 0 where the trained draft's rows were dropped: a plain step)
        return K, lens if K else None, None, None
    new_lens = [len(p.tokens) if h else k for p, h, k in zip(proposed, from_history, model_lens)]
    K = max(new_lens)
    drafts = torch.full((B, K), NO_TOKEN, dtype=torch.long)
    for r, (p, h) in enumerate(zip(proposed, from_history)):
        if h:
            drafts[r, :len(p.tokens)] = torch.tensor(p.tokens, dtype=torch.long)
    kinds = [p.kinds if h else [] for p, h in zip(proposed, from_history)]
    return K, torch.tensor(new_lens), (drafts, torch.tensor(from_history)), kinds


def model_pays(proposed: list[Proposal], from_history: list[bool], chain: np.ndarray, model_lens: list[int],
               model_costs: StepCosts, history_costs: StepCosts, batch: int) -> bool:
    """Whether the trained draft's rows are worth its drafting in a step the history drafts too: expected tokens
    a second with them (the step priced as the model's drafting steps measured) against without them (as the
    history's own steps measured)."""
    history_drafts = sum(len(p.tokens) for p, h in zip(proposed, from_history) if h)
    history_gain = sum(sum(p.chances) for p, h in zip(proposed, from_history) if h)
    model_rows = [(r, k) for r, (h, k) in enumerate(zip(from_history, model_lens)) if not h and k]
    if not model_rows:
        return False
    model_gain = sum(float(chain[r, :k].sum()) for r, k in model_rows)
    with_model = model_costs.ragged(batch, [history_drafts + sum(k for _, k in model_rows)])[0]
    without = history_costs.ragged(batch, [history_drafts])[0]
    return (batch + history_gain + model_gain) / with_model > (batch + history_gain) / without


def drafts_worth_verifying(chances: list[list[float]], costs: StepCosts, batch: int) -> list[int]:
    """How many of its proposed drafts each row verifies, from each draft's chance that it and the row's drafts
    before it are all accepted (a row's chances fall along its proposal). Verifying n drafts across the batch
    costs StepCosts.ragged(n) (the per-token work is packed) and emits, in expectation, batch + the sum of
    their chances: the n drafts taken are the likeliest n, with the n that minimises the expected seconds per
    token; none unless that beats a plain step by DRAFT_MARGIN. So a row deep in a familiar answer drafts
    deep while a row in new text drafts nothing, in the same step."""
    likeliest = sorted(((-c, j, r) for r, row in enumerate(chances) for j, c in enumerate(row)))  # [M]
    keep = [0] * batch
    if not likeliest:
        return keep
    expected = batch + np.concatenate([[0.0], np.cumsum([-c for c, _, _ in likeliest])])  # [M + 1]
    seconds = np.concatenate([[costs(batch)[0]], costs.ragged(batch, np.arange(1, len(likeliest) + 1))]) / expected
    n = int(seconds.argmin())
    for _, j, r in likeliest[:n if seconds[n] < (1 - DRAFT_MARGIN) * seconds[0] else 0]:
        keep[r] = max(keep[r], j + 1)
    return keep


def record_history(history: HistoryDraft, sched: Scheduler, requests: list[int], recordings: dict[int, Recording]):
    """What the rows of `requests` emitted joins the history as they write it: their group's later drafts
    read it (history.learn)."""
    for i in requests:
        if i not in recordings:
            recordings[i] = history.begin(sched.prompts[i])
        recordings[i].update(sched.out[i].tokens)


def decode(d: Decoding, target: Decoder, mtp: Draft | None, params: SamplingParams, greedy: bool,
           max_new_tokens: int, trace: bool, history: HistoryDraft | None = None) -> list[dict]:
    """Step every active row until every request has finished; returns the traced steps (when `trace`).
    With a history draft (mtp None), each row drafts what the history proposes for it; with both (a hybrid
    draft), each row drafts from the one that promises more (hybrid_plan)."""
    sched, stats, traced, recordings = d.sched, d.sched.stats, [], {}
    free = sched.fill(range(len(sched.rows)))
    while not free or sched.compact(free):
        rows = sched.rows
        n_rows = len(rows)
        started = time.perf_counter()
        K, width, lens, room = choose_step_draft_len(d, rows, max_new_tokens)
        proposal = kinds = history_rows = None
        if history is not None and mtp is not None and room:  # a hybrid draft: each row its own source
            K, lens, history_rows, kinds = hybrid_plan(d, history, rows, K, lens, room, max_new_tokens)
            if history_rows is not None and not bool((lens * ~history_rows[1]).any()):  # only the history drafts:
                proposal, history_rows = (history_rows[0], lens), None  # the model drafts nothing, for no row
        fed = feed_pile(d, mtp, rows, K if proposal is None else 0, width)
        if history is not None and mtp is None:
            proposal, kinds = history_proposal(history, sched, rows, K, max_new_tokens, d.costs)
            K, lens = proposal[0].shape[1], proposal[1]
        history_step = K and proposal is not None and mtp is not None  # a hybrid's, without the model's drafting
        requests = list(rows.request)
        step_tokens, num_accepted, p, q_own = speculative_step(target, mtp, rows, d.cache, d.mcache, K, params,
                                                               greedy, d.vocab_ids, proposal, lens, history_rows)
        from_history = history_rows[1] if history_rows is not None else lens > 0 if history_step else None
        if d.acceptance is not None and not history_step:  # (the trained draft's acceptance, from its own rows
            # only; a step it did not draft neither informs nor ages it)
            d.acceptance.update(K, num_accepted, lens if from_history is None else lens * ~from_history)
        if kinds is not None and K:
            history.observe(kinds, num_accepted.tolist())
        if K:  # plain decoding makes no speculative steps
            stats.count_step(K, num_accepted, lens, from_history)
            if trace and mtp is not None and from_history is None:  # (q_own is the trained draft's)
                traced.append(trace_step(mtp, rows, K, num_accepted, p, q_own, lens))
        finished = sched.record(step_tokens, num_accepted, p)  # (its .tolist() waits for an accelerator)
        if history is not None and history.learn:
            record_history(history, sched, requests, recordings)
        if d.costs is not None:  # (rows that verified their own numbers of drafts: a ragged step)
            seconds, drafts = time.perf_counter() - started - fed, None if lens is None or not K else int(lens.sum())
            if not history_step:
                d.costs.record(n_rows, K, seconds, drafts)
            if d.history_costs is not None and (history_step or not K):  # (plain steps: both tables' baseline)
                d.history_costs.record(n_rows, K, seconds, drafts)
        free = sched.fill(finished)
    sched.bar.close()
    return traced


@torch.inference_mode()
def generate(target: Decoder, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = SamplingParams(),
             mode: str = "spec", draft: Draft | HistoryDraft | HybridDraft | None = None, draft_len: int | str = "auto", seed: int | list[int] = 0,
             eos_ids: list[int] | None = None, trace: bool = False, progress: bool = False, *,
             max_batch: int | None = None, max_draft_len: int = DEFAULT_MAX_DRAFT_LEN,
             on_finish: Callable[[int, Rollout], None] | None = None, mtp: Draft | None = None) -> Generation:
    """Generate up to `max_new_tokens` per prompt (token-id lists). `eos_ids` stop a row (default: the
    model's); pass [] to ignore EOS (benchmarks). `seed` is one base seed or one seed per request.
    mode: "spec" (the default, as on the command line; needs `draft`: bebop.drafts.registry.default_draft gives the
    model's shipped one), "spec-greedy" or "ar" (plain sampling, no draft). `mtp=` is the old name of `draft=`.
    draft_len: K, or "auto" (K in 0..max_draft_len chosen every step by cost, bebop.engine.draft_len).
    A HistoryDraft (bebop.drafts.history) drafts each row's own proposal, up to K (or max_draft_len under
    "auto"), and, if it learns, is fed the rollouts as they are written. A HybridDraft (bebop.drafts.hybrid)
    drafts each row from its trained draft or its history, whichever promises more accepted tokens.
    max_batch: rows decoded at once (None: all requests); a finished row takes the next waiting request.
    on_finish(index, rollout) is called once per request as soon as it finishes.
    With a fixed K a request's tokens depend only on its prompt, seed and the settings; with "auto" only
    their distribution is fixed (the target's): the exact sample also depends on the K chosen per step."""
    draft = draft_or_old_mtp(draft, mtp, "generate")
    K_max, spec = check_arguments(target, prompts, max_new_tokens, mode, draft, draft_len, seed, max_batch,
                                  max_draft_len)
    draft = draft if spec else None
    history, draft = history_of(draft), model_of(draft)  # (a hybrid has both)
    auto = spec and draft_len == "auto"
    d = set_up(target, draft, prompts, max_new_tokens, params, mode, K_max, auto, seed, eos_ids, max_batch,
               on_finish, progress, history)
    traced = decode(d, target, draft, params, mode == "spec-greedy", max_new_tokens, trace, history)
    if d.acceptance is not None:  # what the next generation starts from (RL rollouts: the same tasks again)
        d.costs.row_spread = d.acceptance.spread
    table = None
    if trace and traced:
        table = {k: torch.cat([t[k] for t in traced]).numpy() for k in traced[0]}
    return Generation(d.sched.out, d.sched.stats, table)
