"""bebop.engine.step: after plain (K = 0) steps the draft catches up on the positions they piled up (`catch_up`),
so its first draft is its prediction on the whole committed sequence."""

import numpy as np
import pytest
import torch

from bebop.drafts.eagle3 import new_eagle3
from bebop.drafts.registry import new_mtp
from bebop.engine.generation import generate
from bebop.engine.step import Rows
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams, probabilities
from generation_helpers import TEXTS, scheduled


@pytest.mark.parametrize("feature_layers", [(), (0, 1), "eagle3"])
def test_mtp_catches_up_after_steps_without_drafts(warm, monkeypatch, feature_layers):
    """After K = 0 steps (positions piled up unprojected, fed to the MTP when drafting resumes) the first
    draft must be the MTP's prediction on the whole committed sequence: the teacher-forced MTP (MTP.unroll)
    gives the same q. With an MTP reading several layers too, whose features are projected only when the MTP
    reads them, and with an EAGLE-3 draft (its own layer, norm and head)."""
    model, mtp, tok = warm
    if feature_layers == "eagle3":
        mtp = new_eagle3(model, seed=3)
        torch.nn.init.normal_(mtp.fc.weight, std=0.3)
    elif feature_layers:
        mtp = new_mtp(model, seed=3, feature_layers=feature_layers)
        torch.nn.init.normal_(mtp.fc.weight, std=0.3)
    prompts = [chat_ids(tok, t) for t in TEXTS]
    m = 5  # K = 0 steps before the first draft: the MTP sees nothing until then, then all m positions at once
    scheduled(monkeypatch, [0] * m + [2] * 50)
    params = SamplingParams()
    gen = generate(model, prompts, 12, params, mode="spec", draft=mtp, draft_len="auto", max_draft_len=2, seed=2,
                   eos_ids=[], trace=True)
    tr = gen.trace
    for r, (prompt, ro) in enumerate(zip(prompts, gen.rollouts)):
        first = np.flatnonzero((tr["row"] == r) & (tr["depth"] == 0))[0]
        seq = torch.tensor([prompt + ro.tokens])
        with torch.no_grad():
            out = model.forward_full(seq, capture=mtp.feature_layers)
            h = mtp.unroll(seq, mtp.features(out[1] if mtp.feature_layers else out), 1)[0]
            q = probabilities(mtp.draft_logits(h[0, len(prompt) + m - 1]), params)
        assert tr["draft_entropy"][first] == pytest.approx(float(-torch.special.xlogy(q, q).sum()), abs=1e-4)


def test_a_step_the_mtp_did_not_draft_piles_each_rows_committed_positions():
    """A hybrid's step whose drafts all came from the history: the MTP saw none of it, so every position a row
    committed joins its pile, as if the row had made that many plain steps."""
    K, feat = 3, 2
    step_tokens = torch.tensor([[5, 6, -1, -1], [7, 8, 9, 10], [11, -1, -1, -1]])  # [B, K+1]
    feats = torch.arange(3 * (K + 1) * feat, dtype=torch.float32).reshape(3, K + 1, feat)  # [B, K+1, F]
    num_accepted = torch.tensor([1, 3, 0])
    ragged, plain = Rows.empty(3, feat, torch.float32), Rows.empty(3, feat, torch.float32)
    ragged.commit_pile(K, step_tokens, feats, num_accepted, drafted=False)
    for j in range(K + 1):  # the same positions, one plain step at a time, for the rows that committed them
        at = Rows.empty(3, feat, torch.float32)
        at.pile_tokens, at.pile_feats, at.pile_count = plain.pile_tokens, plain.pile_feats, plain.pile_count
        at.commit_pile(0, step_tokens[:, j:j + 1], feats[:, j:j + 1], torch.zeros(3, dtype=torch.long))
        took = j <= num_accepted
        plain.pile_count = torch.where(took, at.pile_count, plain.pile_count)
        plain.pile_tokens, plain.pile_feats = at.pile_tokens, at.pile_feats
    assert ragged.pile_count.tolist() == plain.pile_count.tolist() == [3, 5, 2]
    for r, n in enumerate(ragged.pile_count.tolist()):
        assert ragged.pile_tokens[r, :n].tolist() == plain.pile_tokens[r, :n].tolist()
        assert torch.equal(ragged.pile_feats[r, :n], plain.pile_feats[r, :n])
    assert ragged.pile_tokens[1, 1:5].tolist() == [7, 8, 9, 10]
