"""The one interface the RL loop drives its rollout side through, whichever worker stands behind it: bebop's
engine in this process (rl/workers/local.py) or in a spawned one (rl/workers/process.py), vLLM
(bebop.backends.vllm.worker), or N Ray actors of either (rl/workers/ray.py). Every message across it is plain
data: token lists, floats, and dicts of tensors for weights."""

from typing import Protocol

import torch


class RolloutWorker(Protocol):
    """Generates completions with its own copy of the policy (and draft), in the rollout dtype.

    A batch is asked for with `submit` and collected with `reply`, so a worker in another process can generate
    batch n+1 while the trainer trains on batch n; an in-process worker generates in `submit`."""

    def load_weights(self, policy: dict[str, torch.Tensor], mtp: dict[str, torch.Tensor], version: int) -> None:
        """Copy weights in (any dtype; cast to the worker's): `policy` maps parameter names to tensors
        (bebop.rl.sync.policy_state), `mtp` the draft's (mtp_state; empty: the draft stays as it is).
        `version` is the policy step these weights are, reported back with each batch."""

    def submit(self, prompts: list[list[int]], max_new_tokens: int, seed: int | list[int], learn: bool = True) -> None:
        """Ask for one completion per prompt (token ids). `seed`: the batch's (row b draws from a seed derived
        from it and b) or one per row. `learn`: whether a history draft learns from this batch (not from the
        held-out evaluation: what the run drafts then depends on its training batches alone)."""

    def reply(self) -> dict:
        """The batch last submitted: {"tokens": [[int]] per row, "logprobs": [[float]] per row (log p of each
        sampled token under the distribution it was sampled from), "entropies": [[float]] per row or None,
        "stats": the engine's acceptance summary (acceptance_rate, mean_acceptance_length,
        per_position_acceptance, mean_draft_len, ...), "version": the weights' version, "rollout_s": float};
        Ray adds "dispatch_s"."""

    def probe(self, ids: list[int]) -> dict | list[dict]:
        """{"logprobs": [float] of len(ids) - 1, log p(ids[t] | ids[:t]) at temperature 1 with the weights loaded,
        "draft_error": the draft's relative error against the weights sent, or None}; Ray: one per actor."""

    def draft_state(self) -> dict | None:
        """A history draft's state (bebop.drafts.history.HistoryDraft.state: the rollouts it learnt from, its
        calibration), for the run's checkpoint; None for a draft model, whose weights the trainer holds."""

    def close(self) -> None:
        """Release the worker (its process, actors or engine)."""
