"""bebop.engine.step: after plain (K = 0) steps the draft catches up on the positions they piled up (`catch_up`),
so its first draft is its prediction on the whole committed sequence."""

import numpy as np
import pytest
import torch

from bebop.drafts.eagle3 import new_eagle3
from bebop.drafts.registry import new_mtp
from bebop.engine.generation import generate
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
