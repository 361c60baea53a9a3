"""What the EAGLE-3 tests share: a reduced draft vocabulary and a draft with every weight random."""

import torch

from bebop.drafts.eagle3 import new_eagle3

VOCAB = torch.tensor([0, 3, 5, 7, 10, 42, 100, 258])  # a reduced draft vocabulary of the byte-level tiny models


def scrambled(model, seed, vocab=None):
    """A fresh EAGLE-3 draft with every weight random (norms included), so no term can hide behind a 1 or a 0."""
    draft = new_eagle3(model, seed=seed)
    if vocab is not None:
        draft.set_draft_vocab(vocab)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim == 2 else 1.0) + (1.0 if p.ndim == 1 else 0.0))
    return draft
