"""What the engine's tests share: the chat texts, a sharpened copy of a model and an MTP that agrees with it (a
random tiny model is nearly uniform, which would hide sampling bugs), the token matrix of a generation, and
"auto" made to follow a schedule. Test modules import it by name (pytest puts this folder on sys.path)."""

import copy
import math

import numpy as np
import torch

import bebop.engine.draft_len as autodraft
import bebop.engine.generation as engine
from bebop.drafts.registry import new_mtp
from bebop.sampling import probabilities
from bebop.studies.exactness import goodness_of_fit, two_sample

P_OK = 1e-3  # an exactness check passes above this p-value

TEXTS = ["hello", "What is 2+2?", "Tell me a story about a cat who lived on a boat."]


def sharpened(model, scale):
    """A copy of `model` whose (untied) LM head is `scale` times the original: much lower entropy."""
    m = copy.deepcopy(model)
    head = torch.nn.Linear(m.cfg.dim, m.cfg.vocab_size, bias=False)
    head.weight.data = model.lm_head.weight.detach().clone() * scale
    m.lm_head = head.requires_grad_(False)
    return m


def agreeable_mtp(model, e=0.5, h=0.5, seed=0):
    """An MTP whose input projection is e * I on the token embedding and h * I on the hidden state instead of
    random: its drafts are sharp and, depending on the model, often right."""
    mtp = new_mtp(model, seed)
    d = model.cfg.dim
    with torch.no_grad():
        mtp.eh_proj.weight.zero_()
        mtp.eh_proj.weight[:, :d] = e * torch.eye(d)
        mtp.eh_proj.weight[:, d:] = h * torch.eye(d)
    return mtp


def exact_marginals(model, prompt, params):
    """The exact distributions of generated tokens 0, 1 and 2 after `prompt` [V] each, by one full forward per
    continuation (on the model's device); the model must be sharp enough for the tests to have power."""
    V, device = model.cfg.vocab_size, model.embed.weight.device
    with torch.no_grad():
        def next_probs(seqs):
            return torch.cat([probabilities(model.logits(model.forward_full(c)[:, -1]), params)
                              for c in seqs.split(4096)]).double().cpu()
        x0 = torch.tensor([prompt], device=device)
        p0 = next_probs(x0)[0]
        x1 = torch.cat([x0.expand(V, -1), torch.arange(V, device=device)[:, None]], 1)
        p1 = next_probs(x1)  # [a, V]
        a = torch.nonzero(p0 > 1e-7).flatten()  # the rest carries < 3e-5 of the mass
        x2 = torch.cat([x1[a.to(device)].repeat_interleave(V, 0), torch.arange(V, device=device).repeat(len(a))[:, None]], 1)
        p2 = next_probs(x2).view(len(a), V, V)  # [a, b, V]
        m2 = torch.einsum("ab,abv->v", p0[a, None] * p1[a], p2)
    # sharp enough for the tests to have power: entropy of token 1 given token 0 far below log V
    assert float((p0 * -torch.special.xlogy(p1, p1).sum(-1)).sum()) < 0.6 * math.log(V)
    return [p0.numpy(), (p0 @ p1).numpy(), (m2 / m2.sum()).numpy()]


def token_matrix(gen):
    return np.array([r.tokens for r in gen.rollouts])


def assert_exact_and_like_ar(model, gen, exact, ar, label):
    """Each of the 3 tokens distributed as the exact target distribution and as plain sampling; tokens (1, 2) jointly
    as plain sampling."""
    toks, ref = token_matrix(gen), token_matrix(ar)
    for j in range(3):
        assert goodness_of_fit(toks[:, j], exact[j]) > P_OK, f"{label} token {j} vs exact"
        assert two_sample(toks[:, j], ref[:, j]) > P_OK, f"{label} token {j} vs ar"
    pairs = lambda t: t[:, 1] * model.cfg.vocab_size + t[:, 2]  # noqa: E731
    assert two_sample(pairs(toks), pairs(ref)) > P_OK, f"{label} tokens (1, 2) vs ar"


def scheduled(monkeypatch, schedule, per_row=None):
    """Make "auto" follow `schedule` (cycled, capped as the engine caps it) instead of the cost model: the whole
    batch's K step by step; with per_row="cycled" each row the next entry in turn; with per_row="own" each row
    its own k_r from its own progress (schedule[remaining tokens % len], at most remaining - 1), so a row's
    lengths do not depend on the other rows."""
    it = iter(schedule * 100000)

    def row_lens(row_alphas, remaining, costs, fixed_costs, k, *args):
        if per_row == "own":
            return np.array([min(schedule[r % len(schedule)], k, r - 1) for r in remaining.tolist()])
        if per_row == "cycled":
            return np.array([min(next(it), k) for _ in remaining])
        return np.full(len(remaining), min(next(it), k))

    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0] * (max_k + 1))
    monkeypatch.setattr(engine, "choose_draft_len", lambda alphas, costs, k, drain=None: min(next(it), k))
    monkeypatch.setattr(engine, "choose_row_draft_lens", row_lens)
    monkeypatch.setattr(autodraft.StepCosts, "wants_baseline", lambda self, batch: False)
