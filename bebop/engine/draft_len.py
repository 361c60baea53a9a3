"""`draft_len="auto"`: pick the draft length K of every speculative step by cost.

A step with K drafts costs cost(K) seconds at the current batch size and emits 1 + sum_j prod_{i<=j} alpha_i
tokens per row in expectation, alpha_i being the acceptance of draft i given that drafts
1..i-1 were accepted. The engine takes the K in 0..max that maximises their ratio; K = 0 is plain decoding.
Once no request waits for a row, a draining batch also pays for the rows that speculation scatters: they
finish at different steps and the last ones run on in small, dear steps; there K minimises the expected time
until the last row finishes (drain_seconds), from each row's own acceptance and remaining tokens.

- cost(K) is probed, then corrected by timing online (StepCosts). Online timing alone only learns the K it
  happens to pick; a probe alone misses what a real step does besides (bookkeeping, the context's length)
  and the drift of a shared machine. The probe times the engine's own step (bebop.engine.step) for every K
  once per model, dtype, machine, thread count and batch bucket (powers of two), and caches the seconds in
  registry.cache_dir(); the engine then replaces a K's probed cost by the running average of its measured
  steps once it has taken that K twice at that batch size.
- alpha_i is a running estimate from past steps only (decayed counts with a prior). Exactness needs nothing
  more: K is a function of earlier steps (their acceptance and wall time), never of what the target computes
  in the step it is used for, so each step is an ordinary speculative step with a K fixed beforehand.
"""

import copy
import functools
import json
import math
import time

import numpy as np
import torch

from bebop.io import write_text_atomic
from bebop.drafts.base import Draft, target_forward
from bebop.engine.step import Rows, speculative_step
from bebop.models import cpu, registry
from bebop.sampling import SamplingParams, entropy

COST_FILE = "draft-costs-v5.json"  # the version: what the probe times (a new version probes afresh)


def machine(device: torch.device) -> str:
    """What the cost table depends on besides the model: the GPU, or the CPU model and threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu.cpu_model()} [{cpu.describe()}] x{torch.get_num_threads()} threads"


def bucket(batch: int) -> int:
    return 1 << max(0, batch - 1).bit_length()


@torch.inference_mode()
def probe_costs(target, mtp, batch: int, max_k: int, context: int = 64, repeats: int = 5,
                timer=time.perf_counter) -> tuple[list[float], bool]:
    """Seconds of one engine step (bebop.engine.step.speculative_step: drafting, verifying, rejection sampling)
    with K = 0..max_k drafts at `batch` rows after a `context`-long prompt, plus the entropies the engine records
    (see the module doc). Also returns whether the probe is consistent: no K came out cheaper than a smaller
    one (which only noise can do)."""
    device = target.embed.weight.device
    params = SamplingParams()
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(target.cfg.vocab_size, (batch, context + max_k + 1), generator=gen).to(device)
    cache = target.new_cache(batch, context + max_k + 2)
    model = isinstance(mtp, Draft)  # else a draft without a model (bebop.drafts.history): it proposes for free
    _, feats = target_forward(target, mtp if model else None, tokens[:, :context], cache)  # [batch, context, F]
    mcache = mtp.new_cache(batch, context + 2 * max_k + 2) if model else None
    if model:
        mtp(tokens[:, 1:context + 1], mtp.features(feats), mcache)
    vocab_ids = mtp.vocab_ids if model and len(mtp.vocab_ids) else None
    row_gens = [torch.Generator().manual_seed(row) for row in range(batch)]

    def step(K):  # a drafting step catches the draft up on the K + 1 positions a fully accepted step left
        cache.lengths.fill_(context)
        if model:
            mcache.lengths.fill_(context - K - 1)
        rows = Rows(list(range(batch)), row_gens, torch.zeros(batch, dtype=torch.long, device=device),
                    tokens[:, context].clone(), tokens[:, :K + 1].clone(), feats[:, :K + 1].clone(),
                    torch.full((batch,), K + 1, device=device))
        proposal = None if model else (tokens[:, context + 1:context + 1 + K], torch.full((batch,), K))
        p = speculative_step(target, mtp if model else None, rows, cache, mcache, K, params, False, vocab_ids,
                             proposal)[2]
        entropy(p)
        if device.type == "cuda":
            torch.cuda.synchronize()

    for K in range(max_k + 1):  # warm-up
        step(K)
    # the K values take turns, so a load change on a shared machine hits all of them alike; the minimum over
    # repetitions, as noise only ever adds time; and a step with more drafts is never cheaper than one with fewer
    times = torch.full((repeats, max_k + 1), float("inf"), dtype=torch.float64)
    for rep in range(repeats):
        for K in range(max_k + 1):
            t = timer()
            step(K)
            times[rep, K] = timer() - t
    fastest = times.amin(0)
    return fastest.cummax(0).values.tolist(), bool((fastest[1:] >= fastest[:-1]).all())


# probes that contradicted themselves (a busy host can make cost look flat in K, where it must rise), used by
# this process but not kept on disk, where they would steer later runs
_unsaved: dict[tuple[str, str], list[float]] = {}  # (cache file, key) -> costs


def step_costs(target, mtp, batch: int, max_k: int) -> list[float]:
    """cost(K) for K = 0..max_k at this batch size, from the on-disk table or probed once and stored (a probe
    that contradicted itself only for this process)."""
    b = bucket(batch)
    draft = [f"draft_vocab={len(mtp.vocab_ids) or target.cfg.vocab_size}", f"draft={mtp.arch}",
             f"mtp_layers={len(mtp.blocks)}", f"feature_layers={len(mtp.feature_layers)}"] \
        if isinstance(mtp, Draft) else [f"draft={mtp.arch}"]  # a draft without a model adds no work of its own
    key = "|".join([str(target.name or f"dim{target.cfg.dim}x{target.cfg.n_layers}"),
                    str(target.embed.weight.dtype), str(target.embed.weight.device.type), machine(target.embed.weight.device),
                    f"attention={','.join(target.attention)}", f"linear={target.linear}",
                    f"compiled={int(target.compiled)}", *draft, f"batch={b}"])
    path = registry.cache_dir() / COST_FILE
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    costs = table.get(key, _unsaved.get((str(path), key)))
    if not isinstance(costs, list) or len(costs) < max_k + 1:
        costs, consistent = probe_costs(target, mtp, b, max_k)
        if not consistent:  # noise beat the cost of a draft: probe again in the next process
            _unsaved[(str(path), key)] = costs
            return costs[:max_k + 1]
        table[key] = costs
        try:  # a cache is an optimisation: an unwritable directory only means probing again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(table, indent=1))
        except OSError:
            pass
    return costs[:max_k + 1]


def probe_buckets(target, mtp, max_batch: int, max_k: int) -> None:
    """Probe (or read from the cache) every batch bucket up to `max_batch`, so that a benchmark pays the one-off
    probes before its timed runs; a draining batch passes through every smaller bucket."""
    for b in range(bucket(max_batch).bit_length()):
        step_costs(target, mtp, 1 << b, max_k)


class StepCosts:
    """cost(K) at a batch size: the probed table (see step_costs), corrected online by the measured wall time of
    the steps the engine actually takes. A real step does more than the probe (sampling, bookkeeping, a longer
    context) and a shared machine's speed drifts, so what is learnt is the ratio of a step's measured time to
    its probed time at that exact row count (interpolated between the probes at the bucket's ends, b/2 and b:
    a draining batch crosses a whole bucket). A K measured at least twice at this batch bucket costs its probe times its running average ratio, in
    which a measurement's weight decays with the steps taken at the bucket since (a K not taken for a while is
    re-learnt from its next measurement). Any other K costs its probe times this bucket's plain-step ratio (or
    the mean ratio so far) times that K's ratio relative to plain steps at the nearest bucket that measured
    both: the probe misses more of a drafting step than of a plain one, and trying each K out at a large batch,
    where it loses, is dear when smaller batches have already shown it. Where the bucket's steps drafted per row
    (`ragged`), their ratio prices every drafting K: a draining batch's plan weighs the rows' drafts with these
    costs, and takes no other kind of drafting step to measure them by. A K's own measurement, once `refresh`
    steps old, fades towards that estimate (by `forget` a step): a K measured dear is not taken again, so a
    dear measurement would otherwise stay. The engine takes K = 0 twice per bucket first, and again after every
    `refresh` steps without one (`wants_baseline`): plain decoding is the step every other K must beat, and a
    baseline measured only in a generation's first, slow steps would stay."""

    def __init__(self, target, mtp, max_k: int, decay: float = 0.8, refresh: int = 32, forget: float = 0.98):
        self.target, self.mtp, self.max_k, self.decay, self.refresh = target, mtp, max_k, decay, refresh
        self.forget = forget
        self.probed = {}  # batch bucket -> probed seconds per K
        self.steps = {}  # batch bucket -> steps recorded at it
        self.measured = {}  # (batch bucket, K) -> [running average measured/probed, count, step number when last]
        self.ratio_sum, self.ratio_n = 0.0, 0
        self.catch_up_rate = None  # seconds per row and position the MTP is fed in a catch-up
        self.row_spread = 0.0  # the between-row spread of acceptance the last generation measured (Acceptance)

    def __deepcopy__(self, memo):
        """A copy measures the same models: it refers to them (or to their copies, where they are copied in the
        same deepcopy), never copies them. The costs are kept on a draft (step_costs_for), and a copied history
        draft must not bring a copy of the target along."""
        new = copy.copy(self)
        memo[id(self)] = new
        for name, value in vars(self).items():
            setattr(new, name, memo.get(id(value), value) if name in ("target", "mtp") else copy.deepcopy(value, memo))
        return new

    def probed_at(self, b: int) -> list[float]:
        if b not in self.probed:
            self.probed[b] = step_costs(self.target, self.mtp, b, self.max_k)
        return self.probed[b]

    def probe(self, batch: int) -> list[float]:
        """Probed seconds per K at `batch` rows: linear between the probes at batch sizes b/2 and b."""
        b = bucket(batch)
        if b == 1:
            return self.probed_at(1)
        t = (batch - b // 2) / (b // 2)
        return [lo + t * (hi - lo) for lo, hi in zip(self.probed_at(b // 2), self.probed_at(b))]

    def __call__(self, batch: int) -> list[float]:
        ratios = self.ratios()
        b = bucket(batch)
        own = ratios.get(b, {})
        plain = own.get(0, self.ratio_sum / self.ratio_n if self.ratio_n else 1.0)
        # the buckets that measured plain steps, nearest first (in powers of two)
        near = sorted((abs(other.bit_length() - b.bit_length()), other) for other, r in ratios.items() if 0 in r)
        out = []
        for K, probe in enumerate(self.probe(batch)):
            relative = next((ratios[other][K] / ratios[other][0] for _, other in near
                             if other != b and K in ratios[other]), 1.0)
            prior = plain * relative
            if K and RAGGED in own:  # this bucket's steps of drafts per row measured what its drafting costs
                w = self.forget ** max(0, self.steps[b] - self.measured[(b, RAGGED)][2] - self.refresh)
                prior = w * own[RAGGED] + (1 - w) * prior
            if K in own:  # its own measurement, fading back to the prior once it is `refresh` steps old
                w = self.forget ** max(0, self.steps[b] - self.measured[(b, K)][2] - self.refresh)
                out.append(probe * (w * own[K] + (1 - w) * prior))
            else:
                out.append(probe * prior)
        return out

    def ratios(self) -> dict[int, dict[int, float]]:
        """bucket -> {K: running average measured/probed} for the K measured at least twice there."""
        out = {}
        for (b, K), m in self.measured.items():
            if m[1] >= 2:
                out.setdefault(b, {})[K] = m[0]
        return out

    def record_catch_up(self, positions: int, seconds: float) -> None:
        """A catch-up fed the MTP `positions` (rows x piled positions) in `seconds`."""
        if positions > 0:
            rate = seconds / positions
            self.catch_up_rate = rate if self.catch_up_rate is None else \
                self.decay * self.catch_up_rate + (1 - self.decay) * rate

    def catch_up_seconds(self, positions: int) -> float:
        """What feeding the MTP `positions` piled-up positions costs, as measured so far (0 before)."""
        return max(positions, 0) * (self.catch_up_rate or 0.0)

    def wants_baseline(self, batch: int) -> bool:
        b = bucket(batch)
        m = self.measured.get((b, 0))
        return not m or m[1] < 2 or self.steps[b] - m[2] >= self.refresh

    def ragged(self, batch: int, drafts: np.ndarray) -> np.ndarray:
        """Seconds of steps whose rows verify their own numbers of drafts, `drafts` in all (each entry a total):
        the verify's per-token work is packed (bebop.models.decoder.Packed), so such a step costs about what
        a step with drafts / batch drafts per row costs (the probe, linear between whole K), times what steps
        like it measured against that (RAGGED), fading to the plain steps' ratio once `refresh` steps old (as
        a K's own measurement does in __call__: a step measured dear is not taken again to be re-measured)."""
        b = bucket(batch)
        ratio = self(batch)[0] / self.probe(batch)[0]
        if RAGGED in self.ratios().get(b, {}):
            m = self.measured[(b, RAGGED)]
            w = self.forget ** max(0, self.steps[b] - m[2] - self.refresh)
            ratio = w * m[0] + (1 - w) * ratio
        return self.ragged_probe(batch, drafts) * ratio

    def ragged_probe(self, batch: int, drafts) -> np.ndarray:
        return np.interp(np.asarray(drafts, dtype=np.float64) / batch, np.arange(self.max_k + 1), self.probe(batch))

    def record(self, batch: int, K: int, seconds: float, drafts: int | None = None) -> None:
        """A step at `batch` rows that drafted K per row took `seconds`; with `drafts`, its rows drafted their
        own numbers, `drafts` in all (up to K each; see ragged)."""
        b = bucket(batch)
        if drafts is None:
            ratio = seconds / self.probe(batch)[K]
        else:
            ratio, K = seconds / float(self.ragged_probe(batch, drafts)), RAGGED
        n = self.steps[b] = self.steps.get(b, 0) + 1
        m = self.measured.setdefault((b, K), [ratio, 0, n])
        w = self.decay ** (n - m[2])  # measured the step before: `decay`; many steps ago: ~0
        m[0] = w * m[0] + (1 - w) * ratio if m[1] else ratio
        m[1] += 1
        m[2] = n
        self.ratio_sum += ratio
        self.ratio_n += 1


RAGGED = -1  # StepCosts' key for the steps whose rows drafted their own numbers (K is that of uniform steps)


def step_costs_for(target, mtp, max_k: int) -> StepCosts:
    """The StepCosts of this target, its kernels and this MTP, kept on the MTP across generate calls: a process
    that generates again and again (RL rollouts, bench repetitions) measures plain steps and each K once, not
    once per call (per call, the two forced plain steps per batch bucket would cost a draining batch two plain
    steps at every bucket it passes through)."""
    kept = mtp.__dict__.setdefault("_step_costs", {})
    key = (id(target), str(target.embed.weight.dtype), tuple(target.attention), target.linear, target.compiled, max_k)
    if key not in kept:
        kept[key] = StepCosts(target, mtp, max_k)
    return kept[key]


class Acceptance:
    """Running estimate of the conditional acceptance alpha_i of draft i = 1..max_k, from past steps only: the
    batch's (`alphas`) and each row's own (`row_alphas`, for a draining batch's slowest rows).

    Counts decay every step, so the estimate follows the acceptance as it moves (entropy changes along a
    rollout), and when the engine stops drafting (K = 0 gives no evidence) the estimate drifts back to the
    prior and drafting is tried again. A row's estimate starts from the batch's, worth `row_weight` steps. Rows
    may differ far more than one step's luck, depending on the prompts: with smollm2-135m and its MTP (K = 3)
    draft 1's acceptance had a between-row standard deviation of 0.16 around 0.60 on 46 held-out chat prompts,
    and of 0.05 around 0.61 on 35 samples of arithmetic prompts in groups of eight (`row_spread`). So the spread
    is measured, starting from `prior_spread` (the engine passes what the last generation measured), and the
    measurement is kept in `spread`."""

    def __init__(self, max_k: int, rows: int = 0, prior: float = 0.6, weight: float = 2.0, decay: float = 0.95,
                 row_weight: float = 4.0, prior_spread: float = 0.0):
        self.prior, self.weight, self.decay, self.row_weight = prior, weight, decay, row_weight
        self.spread = prior_spread
        self.reached = torch.zeros(max_k, dtype=torch.float64)
        self.accepted = torch.zeros(max_k, dtype=torch.float64)
        self.row_reached = torch.zeros(rows, max_k, dtype=torch.float64)
        self.row_accepted = torch.zeros(rows, max_k, dtype=torch.float64)

    def update(self, K: int, num_accepted: torch.Tensor, draft_lens: torch.Tensor | None = None) -> None:
        """num_accepted [B]: accepted drafts per row in a step that drafted K (each row its own k_r <= K with
        `draft_lens` [B]: a draft past k_r was not examined)."""
        for counts in (self.reached, self.accepted, self.row_reached, self.row_accepted):
            counts *= self.decay
        if K:
            i = torch.arange(K)
            n = num_accepted.cpu().unsqueeze(1)
            reached, accepted = (n >= i), (n > i)  # draft i+1 was examined / accepted
            if draft_lens is not None:  # (a row whose drafts were another source's counts none: k_r = 0)
                reached &= i < draft_lens.cpu().unsqueeze(1)
                accepted &= reached
            reached, accepted = reached.double(), accepted.double()
            self.row_reached[:, :K] += reached
            self.row_accepted[:, :K] += accepted
            self.reached[:K] += reached.sum(0)
            self.accepted[:K] += accepted.sum(0)

    def alphas(self) -> torch.Tensor:
        return (self.accepted + self.prior * self.weight) / (self.reached + self.weight)

    def row_alphas(self) -> torch.Tensor:
        """[B, max_k]: each row's own estimate, shrunk towards the batch's."""
        return (self.row_accepted + self.alphas() * self.row_weight) / (self.row_reached + self.row_weight)

    def row_spread(self) -> torch.Tensor:
        """[B]: how far each row's acceptance may lie from its estimate, relative to it (one standard deviation):
        the between-row spread of draft 1's acceptance relative to the batch's, from the rows' own counts once
        four rows have four steps' worth (their variance less the binomial part; kept in `spread`), else the
        last such measurement or the prior; shrinking as a row's own evidence grows."""
        n = self.row_reached[:, 0]
        seen = n >= 4
        if int(seen.sum()) >= 4:
            rate = self.row_accepted[seen, 0] / n[seen]
            between = rate.var() - (rate * (1 - rate) / n[seen]).mean()
            self.spread = float(between.clamp_min(0).sqrt() / rate.mean().clamp_min(0.05))
        return self.spread * (self.row_weight / (self.row_weight + n)).sqrt()

    def keep_rows(self, rows: torch.Tensor) -> None:  # as KVCache.keep_rows
        self.row_reached, self.row_accepted = self.row_reached[rows], self.row_accepted[rows]

    def reset_row(self, row: int) -> None:  # a new request in this row
        self.row_reached[row] = 0
        self.row_accepted[row] = 0


def choose_draft_len(alphas: torch.Tensor, costs: list[float], max_k: int, drain: tuple | None = None) -> int:
    """The K in 0..max_k with the least expected time per token (time_per_token); for a draining batch, the
    least expected time until its last row finishes: drain = (row_alphas, row_spread, remaining, fixed_costs)
    as drain_seconds takes them, and the seconds any K > 0 pays first to feed the MTP the positions plain
    steps piled up (StepCosts.catch_up_seconds). K = 0 unless drafting beats it by DRAFT_MARGIN."""
    if drain is not None:
        row_alphas, row_spread, remaining, fixed_costs, backlog = drain
        seconds = drain_seconds(row_alphas, remaining, costs, fixed_costs, max_k, row_spread)
        seconds[1:] += backlog
    else:
        seconds = time_per_token(alphas, costs, max_k)
    K = int(seconds.argmin())
    return K if seconds[K] < (1 - DRAFT_MARGIN) * seconds[0] else 0


# Drafting must promise this much less time than plain decoding. The costs and acceptances behind the promise
# are estimates (a probe, running averages on a shared machine), and the two errors do not cost alike: a plain step wrongly taken loses the predicted gain,
# a drafting step wrongly taken loses its own extra cost and, in a draining batch, scatters the rows.
DRAFT_MARGIN = 0.05


# The arithmetic below runs every step on a few dozen numbers, in numpy: as torch ops each op's dispatch (and
# caches cold after the forward) costs more than the arithmetic.

def emitted_moments(alphas, max_k: int):
    """Mean and variance of the tokens a step with K = 0..max_k drafts emits per row ([..., max_k + 1]), for
    conditional acceptances alphas [..., >= max_k] (numpy): P(emitted > j) = prod_{i<=j} alpha_i for j <= K."""
    chain = np.concatenate([np.ones_like(alphas[..., :1]), np.cumprod(alphas[..., :max_k], -1)], -1)
    mean = np.cumsum(chain, -1)
    second = np.cumsum((2 * np.arange(max_k + 1) + 1) * chain, -1)  # E[emitted^2]
    return mean, np.maximum(second - mean ** 2, 0)


def time_per_token(alphas: torch.Tensor, costs: list[float], max_k: int) -> np.ndarray:
    """Expected seconds per token of each K in 0..max_k: cost(K) / E_K, where a step with K drafts emits
    E_K = 1 + sum_{j<=K} prod_{i<=j} alpha_i tokens per row in expectation. Right while finished rows are
    replaced at once (requests wait for rows)."""
    return np.asarray(costs[:max_k + 1]) / emitted_moments(alphas.double().numpy(), max_k)[0]


def drain_seconds(row_alphas: torch.Tensor, remaining: torch.Tensor, costs: list[float], fixed_costs: list[float],
                  max_k: int, row_spread: torch.Tensor | None = None) -> np.ndarray:
    """Expected seconds until the last of n rows finishes, drafting K = 0..max_k every step from now on; for a
    batch that drains (no request waits for a finished row's place). row_alphas [n, >= max_k] as
    Acceptance.row_alphas; remaining [n]: tokens each row may still emit; costs: a step's seconds at n rows,
    fixed_costs: at one row (a + b); row_spread [n]: the relative uncertainty of each row's acceptance
    (Acceptance.row_spread).

    Per token, drafting can pay (time_per_token) and still lose here: speculating rows advance by random
    amounts and at their own acceptance, so they finish at different steps and the batch runs on with fewer
    and fewer rows, while plain decoding keeps them in step. With a step cost of a + b * (rows still running),
    the drain costs a * (steps until the last row finishes) + b * (sum over rows of their steps). Row r needs
    S_r = R_r / E_K,r steps, give or take sigma_r: sqrt(R_r * V_K,r / E_K,r^3) from each step's luck (V: the
    variance of the tokens a step emits) and, from the uncertainty of the row's acceptance, the steps it needs
    at acceptances one `row_spread` lower. The last of n rows lands about z_n * sigma later (z_n: the expected
    maximum of n standard normals)."""
    steps, finish = drain_steps(row_alphas, remaining, max_k, row_spread)
    a, b = step_cost_parts(costs, fixed_costs, max_k, len(remaining))
    return a * finish.max(0) + b * steps.sum(0)


def drain_steps(row_alphas: torch.Tensor, remaining: torch.Tensor, max_k: int,
                row_spread: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[n, max_k + 1] each: the steps row r needs drafting K every step (R_r / E_K,r), and the step by which
    it has finished as the last of the n rows would (those steps + z_n * sigma_r; see drain_seconds)."""
    alphas = row_alphas.double().cpu().numpy()
    mean, var = emitted_moments(alphas, max_k)  # [n, max_k + 1]
    R = np.maximum(remaining.double().cpu().numpy(), 1)[:, None]
    steps = R / mean
    sigma2 = R * var / mean ** 3
    if row_spread is not None:
        lower = emitted_moments(alphas * (1 - np.clip(row_spread.double().cpu().numpy(), 0, 1))[:, None], max_k)[0]
        sigma2 = sigma2 + (R / lower - steps) ** 2
    return steps, steps + expected_max_of_normals(len(remaining)) * np.sqrt(sigma2)


def step_cost_parts(costs: list[float], fixed_costs: list[float], max_k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A step at n rows drafting K each costs a_K + b_K * n: from its cost at n rows and at one ([max_k + 1])."""
    one = np.asarray(fixed_costs[:max_k + 1], dtype=np.float64)
    b = np.maximum(np.asarray(costs[:max_k + 1]) - one, 0) / max(n - 1, 1)
    return one - b, b


def choose_row_draft_lens(row_alphas: torch.Tensor, remaining: torch.Tensor, costs: list[float],
                          fixed_costs: list[float], max_k: int, row_spread: torch.Tensor | None = None,
                          backlog: float = 0.0) -> np.ndarray:
    """Each row's own draft length k_r in 0..max_k [n] for a draining batch (arguments as drain_seconds; backlog
    as choose_draft_len). A step whose rows draft k_r costs about a_K + sum_r b_{k_r} (step_cost_parts, K the
    deepest k_r), so the drain costs about

        a_0 * L + (a_K - a_0) * D + sum_r b_{k_r} * S_r(k_r)

    with S_r the steps row r needs, L the step by which the last row finishes and D the step by which the last
    drafting row does (drain_steps). The drain ends with its slowest row: drafting pays in the rows that would
    finish last (the long tail), while a row far ahead drafts only where that is cheaper for its own work. So
    for every deepest K and every step L some row could finish by, each row takes, among the k_r <= K that finish
    by L, either the one with the least own work or, where plain decoding finishes by L, none; the cheapest of
    these plans is taken if it beats plain decoding by DRAFT_MARGIN. No row drafts past its remaining tokens."""
    n = len(remaining)
    steps, finish = drain_steps(row_alphas, remaining, max_k, row_spread)
    a, b = step_cost_parts(costs, fixed_costs, max_k, n)
    allowed = np.arange(max_k + 1) < np.maximum(remaining.cpu().numpy(), 1)[:, None]  # [n, max_k + 1] (K = 0 always)
    finish = np.where(allowed, finish, np.inf)
    own = np.where(allowed, b * steps, np.inf)  # [n, max_k + 1] each row's own work over the drain
    plain = a[0] * finish[:, 0].max() + own[:, 0].sum()
    best, lens = (1 - DRAFT_MARGIN) * plain, np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    for K in range(1, max_k + 1):
        ends = finish[:, :K + 1]
        ends = np.unique(ends[np.isfinite(ends) & (ends >= ends.min(1).max())])  # [M] candidate L: those some
        # plan can reach (no L before the slowest row's fastest finish)
        by_end = finish[None, :, :K + 1] <= ends[:, None, None]  # [M, n, K + 1]
        work = np.where(by_end, own[None, :, :K + 1], np.inf)
        for k in (work.argmin(-1), np.where(by_end[..., 0], 0, work.argmin(-1))):  # [M, n] least work / needed only
            cost = work[np.arange(len(ends))[:, None], rows, k]  # [M, n]
            fin = finish[rows, k]  # [M, n]
            L, D = fin.max(-1), np.where(k > 0, fin, 0).max(-1)
            total = a[0] * L + (a[k.max(-1)] - a[0]) * D + cost.sum(-1) + np.where(k.max(-1) > 0, backlog, 0)
            total[~np.isfinite(cost).all(-1)] = np.inf  # some row cannot finish by L
            i = int(total.argmin())
            if total[i] < best:
                best, lens = total[i], k[i]
    return lens


@functools.cache
def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals]: integral of x * n * pdf(x) * cdf(x)^(n-1)."""
    x = torch.linspace(-10, 10, 8001, dtype=torch.float64)
    pdf = torch.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    return float((x * n * pdf * cdf ** (n - 1)).sum() * (x[1] - x[0]))
