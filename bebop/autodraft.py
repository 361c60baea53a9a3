"""`draft_len="auto"`: pick the draft length K of every speculative step by cost.

A step with K drafts costs cost(K) seconds at the current batch size and emits 1 + sum_j prod_{i<=j} alpha_i
tokens per row in expectation (NOTES.md section 2), alpha_i being the acceptance of draft i given that drafts
1..i-1 were accepted. The engine takes the K in 0..max that maximises their ratio; K = 0 is plain decoding.

- cost(K) is probed, then corrected by timing online (StepCosts). Online timing alone only learns the K it
  happens to pick; a probe alone misses what a real step does besides the forwards (sampling, bookkeeping,
  the context's length) and the drift of a shared machine. The probe times the step's two forwards (target
  verifying K + 1 tokens, MTP catch-up and K - 1 recursions with their draft heads) for every K once per
  model, dtype, machine, thread count and batch bucket (powers of two), and caches the seconds in
  registry.cache_dir(); the engine then replaces a K's probed cost by the running average of its measured
  steps once it has taken that K twice at that batch size.
- alpha_i is a running estimate from past steps only (decayed counts with a prior). Exactness needs nothing
  more: K is a function of earlier steps (their acceptance and wall time), never of what the target computes
  in the step it is used for, so each step is an ordinary speculative step with a K fixed beforehand.
"""

import json
import time

import torch

from bebop.checkpoint import write_text_atomic
from bebop.models import registry
from bebop.models.dtype import cpu_model
from bebop.mtp import target_forward
from bebop.sampling import SamplingParams, probabilities

COST_FILE = "draft-costs-v2.json"  # v2: minimum over interleaved repetitions


def machine() -> str:
    """What the cost table depends on besides the model: the accelerator or the CPU model, and threads."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}"
    name = cpu_model()
    return f"{name} x{torch.get_num_threads()} threads"


def bucket(batch: int) -> int:
    return 1 << max(0, batch - 1).bit_length()


@torch.inference_mode()
def probe_costs(target, mtp, batch: int, max_k: int, context: int = 64, repeats: int = 5) -> list[float]:
    """Seconds of one step's forwards with K = 0..max_k drafts at `batch` rows (see the module doc)."""
    device = target.embed.weight.device
    params = SamplingParams()
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(target.cfg.vocab_size, (batch, context + max_k + 1), generator=gen).to(device)
    cache = target.new_cache(batch, context + max_k + 2)
    hidden = target(tokens[:, :context], cache)
    mcache = mtp.new_cache(batch, context + 2 * max_k + 2)
    mtp(tokens[:, 1:context + 1], hidden, mcache)

    def step(K):
        cache.lengths.fill_(context)
        mcache.lengths.fill_(context - K - 1)
        if K:
            h = mtp(tokens[:, :K + 1], hidden[:, :K + 1], mcache)[:, -1]
            mcache.lengths += K + 1
            for k in range(K):
                if k:
                    h = mtp(tokens[:, k:k + 1], h.unsqueeze(1), mcache)[:, 0]
                    mcache.lengths += 1
                probabilities(mtp.draft_logits(h), params)
        probabilities(target.logits(target_forward(target, mtp, tokens[:, :K + 1], cache)[0]), params)
        if device.type == "cuda":
            torch.cuda.synchronize()

    for K in range(max_k + 1):  # warm-up
        step(K)
    # the K values take turns, so a load change on a shared machine hits all of them alike; the minimum over
    # repetitions, as noise only ever adds time; and a step with more drafts is never cheaper than one with fewer
    times = torch.full((repeats, max_k + 1), float("inf"), dtype=torch.float64)
    for rep in range(repeats):
        for K in range(max_k + 1):
            t = time.perf_counter()
            step(K)
            times[rep, K] = time.perf_counter() - t
    return times.amin(0).cummax(0).values.tolist()


def step_costs(target, mtp, batch: int, max_k: int) -> list[float]:
    """cost(K) for K = 0..max_k at this batch size, from the on-disk table or probed once and stored."""
    b = bucket(batch)
    key = "|".join([str(target.name or f"dim{target.cfg.dim}x{target.cfg.n_layers}"),
                    str(target.embed.weight.dtype), str(target.embed.weight.device.type), machine(),
                    f"attention={','.join(target.attention)}", f"linear={target.linear}",
                    f"draft_vocab={len(mtp.vocab_ids) or target.cfg.vocab_size}", f"mtp_layers={len(mtp.blocks)}",
                    f"feature_layers={len(mtp.feature_layers)}", f"batch={b}"])
    path = registry.cache_dir() / COST_FILE
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    costs = table.get(key)
    if not isinstance(costs, list) or len(costs) < max_k + 1:
        costs = probe_costs(target, mtp, b, max_k)
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
    a draining batch crosses a whole bucket, and at 64 rows a step with two drafts cost 145 ms while its
    running average, taken as rows finished, said 123; the plain steps, all measured at 64 rows, then looked
    dear). A K measured at least twice at this batch bucket costs its probe times its running average ratio, in
    which a measurement's weight decays with the steps taken at the bucket since (a K not taken for a while is
    re-learnt from its next measurement); any other K its probe times the mean ratio so far. The engine takes
    K = 0 twice per bucket first, and again after every `refresh` steps without one (`wants_baseline`): plain
    decoding is the step every other K must beat, and a baseline measured only in a generation's first, slow
    steps stayed: at batch 64 it stood at 107.6 ms against ~90 ms for plain steps later, and drafting was chosen
    where it did not pay."""

    def __init__(self, target, mtp, max_k: int, decay: float = 0.8, refresh: int = 32):
        self.target, self.mtp, self.max_k, self.decay, self.refresh = target, mtp, max_k, decay, refresh
        self.probed = {}  # batch bucket -> probed seconds per K
        self.steps = {}  # batch bucket -> steps recorded at it
        self.measured = {}  # (batch bucket, K) -> [running average measured/probed, count, step number when last]
        self.ratio_sum, self.ratio_n = 0.0, 0

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
        probe, scale = self.probe(batch), self.ratio_sum / self.ratio_n if self.ratio_n else 1.0
        out = []
        for K in range(self.max_k + 1):
            m = self.measured.get((bucket(batch), K))
            out.append(probe[K] * (m[0] if m and m[1] >= 2 else scale))
        return out

    def wants_baseline(self, batch: int) -> bool:
        b = bucket(batch)
        m = self.measured.get((b, 0))
        return not m or m[1] < 2 or self.steps[b] - m[2] >= self.refresh

    def record(self, batch: int, K: int, seconds: float) -> None:
        b = bucket(batch)
        ratio = seconds / self.probe(batch)[K]
        n = self.steps[b] = self.steps.get(b, 0) + 1
        m = self.measured.setdefault((b, K), [ratio, 0, n])
        w = self.decay ** (n - m[2])  # measured the step before: `decay`; many steps ago: ~0
        m[0] = w * m[0] + (1 - w) * ratio if m[1] else ratio
        m[1] += 1
        m[2] = n
        self.ratio_sum += ratio
        self.ratio_n += 1


def step_costs_for(target, mtp, max_k: int) -> StepCosts:
    """The StepCosts of this target, its kernels and this MTP, kept on the MTP across generate calls: a process
    that generates again and again (RL rollouts, bench repetitions) measures plain steps and each K once, not
    once per call. Per call, the two forced plain steps per batch bucket cost a draining 32-row RL batch up to
    12 plain steps (buckets 32 down to 1) out of its ~60."""
    kept = mtp.__dict__.setdefault("_step_costs", {})
    key = (id(target), str(target.embed.weight.dtype), tuple(target.attention), target.linear, max_k)
    if key not in kept:
        kept[key] = StepCosts(target, mtp, max_k)
    return kept[key]


class Acceptance:
    """Running estimate of the conditional acceptance alpha_i of draft i = 1..max_k, from past steps only.

    Counts decay every step, so the estimate follows the acceptance as it moves (entropy changes along a
    rollout), and when the engine stops drafting (K = 0 gives no evidence) the estimate drifts back to the
    prior and drafting is tried again."""

    def __init__(self, max_k: int, prior: float = 0.6, weight: float = 2.0, decay: float = 0.95):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.reached = torch.zeros(max_k, dtype=torch.float64)
        self.accepted = torch.zeros(max_k, dtype=torch.float64)

    def update(self, K: int, num_accepted: torch.Tensor) -> None:
        """num_accepted [B]: accepted drafts per row in a step that drafted K."""
        self.reached *= self.decay
        self.accepted *= self.decay
        if K:
            i = torch.arange(K).unsqueeze(1)
            n = num_accepted.cpu().unsqueeze(0)
            self.reached[:K] += (n >= i).sum(1).double()  # draft i+1 was examined
            self.accepted[:K] += (n > i).sum(1).double()

    def alphas(self) -> torch.Tensor:
        return (self.accepted + self.prior * self.weight) / (self.reached + self.weight)


def choose_draft_len(alphas: torch.Tensor, costs: list[float], max_k: int) -> int:
    """argmax over K in 0..max_k of (1 + sum_{j<=K} prod_{i<=j} alpha_i) / cost(K)."""
    expected = torch.cat([torch.ones(1, dtype=torch.float64), alphas[:max_k].cumprod(0)]).cumsum(0)
    rate = expected / torch.tensor(costs[:max_k + 1], dtype=torch.float64)
    return int(rate.argmax())
