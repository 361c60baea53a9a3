"""`bebop check-exactness`: passes the engine as it is, with either draft kind, and fails an engine that emits
drafts unverified or resamples from p after a rejection (a user's check must be able to fail)."""

import copy
import json

import pytest
import torch

from bebop import sampling

import bebop.engine.step as engine
from bebop.studies.exactness import check_exactness
from bebop.cli import main


def run(tmp_path, capsys, *extra):
    out = tmp_path / "exactness.json"
    argv = ["check-exactness", "--model", "tiny-qwen3", "--samples", "1500", "--prompt", "Hi!", "--seed", "3",
            "--temperature", "0.3",  # sharper than the seeded model at T = 1 (near uniform): more power
            "--json", str(out), *extra]
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, json.loads(out.read_text()) if out.exists() else None, capsys.readouterr().out


@pytest.mark.parametrize("draft,mode", [("random", "spec"), ("random-eagle3", "spec"), ("random-eagle3", "spec-greedy")])
def test_the_engine_passes(tmp_path, capsys, draft, mode):
    code, result, out = run(tmp_path, capsys, "--mtp", draft, "--mode", mode)
    assert code == 0 and result["passed"], out
    if mode == "spec":  # both paths ran: the test had something to test (greedy drafts of a random draft: ~0)
        assert 0.05 < result["acceptance_rate"] < 0.98
    assert "consistent with exact sampling" in out and len(result["tests"]) == 5


def test_unverified_drafts_fail(tmp_path, capsys, monkeypatch):
    def accept_all(target_probs, draft_probs, draft_tokens, accept_u, final_u, vocab_ids=None, draft_lens=None,
                   proposed=None):
        B, K = draft_tokens.shape
        bonus = sampling.sample(target_probs[:, K], final_u)
        return torch.cat([draft_tokens, bonus[:, None]], 1), torch.full((B,), K)

    monkeypatch.setattr(engine, "rejection_sample_uniform", accept_all)
    code, result, out = run(tmp_path, capsys, "--mtp", "random-eagle3")
    assert code == 1 and not result["passed"] and "NOT exact" in out


def test_a_wrong_residual_fails(tiny_llama, monkeypatch):
    """Resampling from p after a rejection biases towards the draft's tokens: visible on a sharpened model (the
    seeded one is too flat for the bias to show in a few thousand samples)."""
    from bebop.drafts.eagle3 import new_eagle3
    from bebop.sampling import SamplingParams

    model = copy.deepcopy(tiny_llama[0])
    model.lm_head = torch.nn.Linear(model.cfg.dim, model.cfg.vocab_size, bias=False).requires_grad_(False)
    model.lm_head.weight.copy_(tiny_llama[0].lm_head.weight * 8)
    prompt = tiny_llama[1]("Hi!", add_special_tokens=False)["input_ids"]
    draft = new_eagle3(model, 2)
    exact = check_exactness(model, draft, prompt, SamplingParams(1.0), samples=3000, seed=4)
    assert exact["passed"] and 0.1 < exact["acceptance_rate"] < 0.9
    monkeypatch.setattr(sampling, "residual", lambda p, q, vocab_ids=None: p)
    biased = check_exactness(model, draft, prompt, SamplingParams(1.0), samples=3000, seed=4)
    assert not biased["passed"], biased


def test_too_few_samples_for_any_cell_is_no_evidence_either_way():
    """Tokens so spread that no cell expects MIN_COUNT samples merge into one cell: the goodness of fit has no
    degree of freedom, so its p-value is 1 (not NaN, which would read as a failure), while a token of
    probability 0 still fails."""
    import numpy as np

    from bebop.studies.exactness import goodness_of_fit

    probs = np.full(1000, 1e-3)
    assert goodness_of_fit(np.arange(50), probs) == 1.0
    probs[7] = 0
    assert goodness_of_fit(np.array([7, 8]), probs) == 0.0
