"""`bebop check-exactness`: is speculative sampling with this model, draft and settings lossless, here?

The statistical test the suite runs on its tiny models (tests/engine/test_generation.py), on the user's own model and
draft: many samples of the first few tokens of one prompt, speculative and plain, then chi-square tests
  - token 1 against the model's exact next-token distribution (goodness of fit),
  - each token position, and the pair of the last two, speculative against plain (two-sample),
with cells of small expectation merged. Exact sampling passes each test with probability 1 - alpha; a draft or
engine setting that biases the output fails it, with power that grows with the samples.
"""

import numpy as np
import torch
from scipy.stats import chi2_contingency, chisquare

from bebop.engine.generation import generate
from bebop.sampling import SamplingParams, probabilities

MIN_COUNT = 5  # cells expected (or seen) fewer times are merged into one


def goodness_of_fit(samples: np.ndarray, probs: np.ndarray) -> float:
    """p-value of `samples` (token ids) being drawn from `probs` [V]; a token of probability 0 gives 0."""
    counts = np.bincount(samples, minlength=len(probs)).astype(float)
    if counts[probs <= 0].sum() > 0:
        return 0.0
    expected = probs / probs.sum() * len(samples)
    big = expected >= MIN_COUNT
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    if keep.sum() < 2:
        return 1.0  # every token merged into one cell (too few samples for any cell): nothing to test
    return float(chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue)


def two_sample(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of two samples of values coming from one distribution (chi-square on the seen values)."""
    values = np.union1d(a, b)
    ca = np.array([(a == v).sum() for v in values])
    cb = np.array([(b == v).sum() for v in values])
    big = (ca + cb) >= 2 * MIN_COUNT
    ca, cb = np.append(ca[big], ca[~big].sum()), np.append(cb[big], cb[~big].sum())
    keep = (ca + cb) > 0
    if keep.sum() < 2:
        return 1.0  # one value only: nothing to tell apart
    return float(chi2_contingency(np.stack([ca[keep], cb[keep]]))[1])


@torch.inference_mode()
def check_exactness(model, draft, prompt: list[int], params: SamplingParams, mode: str = "spec", samples: int = 2000,
                    tokens: int = 3, draft_len: int = 2, seed: int = 0, max_batch: int = 512, alpha: float = 1e-3) -> dict:
    """Samples of the first `tokens` tokens after `prompt`, with `mode` and plainly, and the tests above.
    Returns {"tests": [{"test", "p_value"}], "alpha", "passed", "acceptance_rate", ...}."""
    def rows(mode, seed):
        g = generate(model, [prompt] * samples, tokens, params, mode=mode, draft=draft if mode != "ar" else None,
                     draft_len=draft_len, seed=seed, eos_ids=[], max_batch=max_batch)
        return np.array([r.tokens for r in g.rollouts]), g.stats

    spec, stats = rows(mode, seed)
    plain, _ = rows("ar", seed + 1)
    p0 = probabilities(model.logits(model.forward_full(torch.tensor([prompt], device=model.embed.weight.device))[:, -1]),
                       params)[0].double().cpu().numpy()
    tests = [{"test": "token 1 vs the model's distribution", "p_value": goodness_of_fit(spec[:, 0], p0)}]
    tests += [{"test": f"token {j + 1} vs plain sampling", "p_value": two_sample(spec[:, j], plain[:, j])}
              for j in range(tokens)]
    if tokens >= 2:
        pair = lambda t: t[:, -2].astype(np.int64) * model.cfg.vocab_size + t[:, -1]  # noqa: E731
        tests.append({"test": f"tokens ({tokens - 1}, {tokens}) vs plain sampling", "p_value": two_sample(pair(spec), pair(plain))})
    threshold = alpha / len(tests)  # Bonferroni: alpha for the whole family of tests
    return {"tests": tests, "alpha": alpha, "threshold": threshold, "passed": all(t["p_value"] > threshold for t in tests),
            "samples": samples, "mode": mode, "draft_len": draft_len, "acceptance_rate": stats.acceptance_rate,
            "per_position_acceptance": stats.per_position_acceptance}
