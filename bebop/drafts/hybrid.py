"""A trained draft and a history draft together (`HybridDraft`): per row and step, the source that promises
more accepted tokens drafts.

RL's rows differ: a row deep in text its prompt's earlier rollouts (or its group's other samples) already
wrote is best drafted from that history, for free and often many tokens deep; a row in new text is best drafted
by the trained draft (EAGLE-3 or MTP). Each step the engine asks the history for every row's proposal and
compares what it promises (the sum of its calibrated chances, HistoryDraft.propose) with what the trained draft
promises for the row (its running acceptance per depth, over the drafts the row would verify); the row drafts
from the source with more. The trained draft drafts every step some row takes from it, for every row (its
drafts are batched); rows that take the history's drafts replace them with its proposal.

Exact as both are: a row's source and lengths are chosen before the step from earlier text and earlier
outcomes, its drafts are sampled from q (the trained draft) or proposed with q one-hot (the history), and the
rejection rule with that row's own q keeps the target's distribution.
"""

from dataclasses import dataclass

import numpy as np

from bebop.drafts.base import Draft
from bebop.drafts.history import HistoryDraft, Proposal

MODEL_PRIOR = 0.6  # the trained draft's acceptance per depth where none is measured (a fixed draft length)


@dataclass
class HybridDraft:
    model: Draft  # the trained draft: an EAGLE-3 head or an MTP module
    history: HistoryDraft
    arch = "hybrid"

    def __repr__(self) -> str:
        return f"HybridDraft({self.model.arch}, {self.history!r})"


def history_of(draft) -> HistoryDraft | None:
    """The history a draft drafts from: a history draft's own, a hybrid's, else None."""
    return draft if isinstance(draft, HistoryDraft) else draft.history if isinstance(draft, HybridDraft) else None


def model_of(draft) -> Draft | None:
    """The draft model a draft runs: itself, a hybrid's trained draft, else None (a history draft)."""
    return draft if isinstance(draft, Draft) else draft.model if isinstance(draft, HybridDraft) else None


def choose_sources(proposals: list[Proposal], model_chain: np.ndarray, model_lens: list[int]) -> list[bool]:
    """Which rows draft from the history: those whose proposal promises more accepted tokens (the sum of its
    chances) than the trained draft's drafts the row would verify (model_chain [B, K]: the chance that drafts
    1..j are all accepted; model_lens: how many the row would verify)."""
    return [bool(p.tokens) and sum(p.chances) > float(model_chain[r, :k].sum())
            for r, (p, k) in enumerate(zip(proposals, model_lens))]
