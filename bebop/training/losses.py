"""Training losses for the MTP draft, aimed at what speculative decoding actually rewards: accepted drafts.

Shapes: p (target, after temperature) and q (draft) are probabilities [..., K, V]; depth k (index k-1) predicts
the token k positions after the target's own next token. `mask` is bool [..., K] (None = all valid). Every loss
returns a scalar averaged over the valid entries; with nothing valid it returns 0 (not nan), so an empty batch
cannot poison the optimizer.

With rejection sampling a draft token x ~ q is kept with probability min(1, p(x)/q(x)), so one depth is accepted
with probability alpha = sum_v min(p, q) = 1 - TV(p, q), and a run of K drafts yields on average
E[A] = sum_j prod_{i<=j} alpha_i accepted tokens (depth j only counts if every earlier depth was accepted).
"""

import torch
import torch.nn.functional as F


def acceptance(p, q):
    """alpha = sum_v min(p, q): the chance rejection sampling keeps a draft token x ~ q. Shape [..., K]."""
    return torch.minimum(p, q).sum(-1)


def _valid_prefix(mask, shape):
    """The leading run of valid depths: a masked depth ends the draft, since nothing after it can be accepted."""
    if mask is None:
        return None
    return mask.expand(shape).to(torch.int8).cumprod(-1).bool()


def _masked_mean(x, mask):
    if mask is None:
        return x.mean()
    mask = mask.expand_as(x)
    # where, not multiply: an inf/nan at a padded entry must not leak into the sum
    return torch.where(mask, x, 0).sum() / mask.sum().clamp_min(1)


def expected_accepted_length(alpha, mask=None):
    """E[A] = sum_j prod_{i<=j} alpha_i per position, shape [...]; a masked depth ends the product."""
    prefix = _valid_prefix(mask, alpha.shape)
    if prefix is None:
        return alpha.cumprod(-1).sum(-1)
    # fill masked depths with 1 (not 0) so cumprod's backward never sees masking zeros, then drop them
    run = torch.where(prefix, alpha, 1).cumprod(-1)
    return torch.where(prefix, run, 0).sum(-1)


def ce_loss(q_logits, labels, mask=None):
    """Hard-label cross-entropy of draft logits [..., K, V] against labels [..., K]: the usual MTP objective."""
    if mask is not None:
        labels = torch.where(mask, labels, 0)  # padded labels (e.g. -100) must not reach cross_entropy
    ce = F.cross_entropy(q_logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)
    return _masked_mean(ce, mask)


def _kl(p, q):
    """KL(p || q) per [..., K]. 0 log 0 = 0; q is clamped to the dtype's smallest normal so q = 0 under p > 0
    costs a large finite amount (~87 nats in float32) instead of inf, and gradients stay finite."""
    logp = torch.where(p > 0, p, 1).log()  # log 1 = 0 at p = 0: no -inf anywhere, not even in p's gradient
    logq = q.clamp_min(torch.finfo(q.dtype).tiny).log()
    return (p * (logp - logq)).sum(-1)


def kl_loss(p, q, mask=None):
    """Forward KL(p || q): distillation onto the full target distribution, mode-covering."""
    return _masked_mean(_kl(p, q), mask)


def tv_loss(p, q, mask=None):
    """Mean of 1 - alpha = TV(p, q): directly the per-depth rejection probability."""
    return _masked_mean(1 - acceptance(p, q), mask)


def e2e_tv_loss(p, q, mask=None):
    """1 - E[A]/K_valid per position, averaged over positions with at least one valid depth.

    p: the target's probabilities (after temperature), float [..., K, V]; q: the draft's, same shape (softmax of
    its logits; gradients flow through q). mask: bool [..., K] or None (all valid); a masked depth ends that
    position's draft. Returns a scalar tensor in [0, 1]: 0 when every draft is always accepted, 0 if nothing is valid.

    Unlike tv_loss, this weights early depths more, since a rejection at depth i wastes every draft after it.
    K_valid is the length of the leading run of valid depths."""
    alpha = acceptance(p, q)
    ea = expected_accepted_length(alpha, mask)
    if mask is None:
        return (1 - ea / alpha.shape[-1]).mean()
    k_valid = _valid_prefix(mask, alpha.shape).sum(-1)
    return _masked_mean(1 - ea / k_valid.clamp_min(1), k_valid > 0)


def lk_loss(p, q, mask=None, eta=3.0):
    """lam*KL + (1-lam)*(1-alpha) with lam = exp(-eta*alpha), alpha detached.

    KL gives useful gradients when the draft is far off (alpha small, where TV's gradient through a softmax is weak);
    as alpha grows the weight moves to TV, the quantity acceptance depends on. lam is a schedule, not a
    target, so no gradient flows through it."""
    alpha = acceptance(p, q)
    lam = torch.exp(-eta * alpha.detach())
    return _masked_mean(lam * _kl(p, q) + (1 - lam) * (1 - alpha), mask)


# ----- the losses by name, as the CLI and the trainers take them -----
LOSSES = ("ce", "kl", "tv", "e2e-tv", "lk", "kl+e2e-tv")


def loss_at(name: str, step: int, steps: int) -> str:
    """'kl+e2e-tv': KL for the first half of the budget (a good start), e2e-TV after (what acceptance pays)."""
    if name == "kl+e2e-tv":
        return "kl" if step < steps // 2 else "e2e-tv"
    return name


def loss_value(name, q_logits, p, labels, mask):
    """The loss `name` (one of LOSSES but the schedule) from draft logits q_logits [N, K, V], teacher p, labels
    [N, K] (draft-vocabulary indices, -1 outside it: no CE target) and mask [N, K]."""
    if name == "ce":
        return ce_loss(q_logits, labels.clamp_min(0), mask & (labels >= 0))
    q = q_logits.softmax(-1)
    fn = {"kl": kl_loss, "tv": tv_loss, "e2e-tv": e2e_tv_loss, "lk": lk_loss}[name]
    return fn(p, q, mask)
