"""The rollout worker in this process: a copy of the policy (and draft) in the rollout dtype, generating with
bebop's engine; the synchronous loop's worker, and what a spawned process or a Ray actor runs inside."""

import copy
import time

import torch

from bebop.backends.vllm.worker import VllmRolloutWorker
from bebop.drafts.base import Draft
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft, history_of, model_of
from bebop.drafts.registry import build_draft
from bebop.engine.generation import generate
from bebop.models import DTYPES
from bebop.models.decoder import Decoder
from bebop.rl.sync import token_logprobs
from bebop.sampling import SamplingParams


class LocalWorker:
    """A RolloutWorker (bebop.rl.workers.base) in this process, built bare from `spec` (bebop.rl.sync.model_spec):
    `load_weights` copies weights in (any dtype); `generate` returns plain data."""

    def __init__(self, spec: dict, dtype: str, rollout: str, draft_len: int | str, max_draft_len: int,
                 temperature: float):
        self.model = Decoder(spec["cfg"], max_len=4096).to(spec["device"], DTYPES[dtype]).eval().requires_grad_(False)
        self.model.name, self.model.eos_ids = spec["name"], spec["eos_ids"]
        self.model.attention, self.model.linear = spec["attention"], spec["linear"]
        self.model.compiled = spec.get("compiled", False)
        model = history = None
        if spec["mtp"] is not None:
            model = build_draft(self.model, copy.deepcopy(spec["mtp"]["config"])).to(spec["device"], DTYPES[dtype])
            model.requires_grad_(False).eval()
            ids = spec["mtp"]["vocab_ids"]
            model.set_draft_vocab(torch.tensor(ids) if ids else None)
        if spec.get("history") is not None:  # a history draft (alone or in a hybrid): it learns from these rollouts
            history = HistoryDraft.from_state(spec["history"])
        self.mtp = HybridDraft(model, history) if model is not None and history is not None else model or history
        self.rollout, self.draft_len, self.max_draft_len = rollout, draft_len, max_draft_len
        self.params = SamplingParams(temperature)
        self.version = -1
        self._pending = None

    @torch.no_grad()
    def load_weights(self, policy: dict, mtp: dict, version: int) -> None:
        own = dict(self.model.named_parameters())
        for k, v in policy.items():
            own[k].copy_(v)
        draft = model_of(self.mtp)
        if draft is not None:
            own = draft.state_dict()
            for k, v in mtp.items():
                own[k].copy_(v)
            # the draft head is a cached slice of the policy's head: rebuild it from the weights just loaded
            draft.set_draft_vocab(draft.vocab_ids if len(draft.vocab_ids) else None)
        self.version = version

    @torch.no_grad()
    def probe(self, ids: list[int]) -> dict:
        """log p(ids[t] | ids[:t]) at temperature 1 with the weights loaded (the trainer checks the sync)."""
        logits = self.model.logits(self.model.forward_full(torch.tensor([ids], device=self.model.embed.weight.device)))
        return {"logprobs": token_logprobs(logits[0], ids), "draft_error": None}  # the draft's weights are copies

    def generate(self, prompts: list[list[int]], max_new_tokens: int, seed: int | list[int], learn: bool = True) -> dict:
        t0 = time.perf_counter()
        if history_of(self.mtp) is not None:
            history_of(self.mtp).learn = learn
        g = generate(self.model, prompts, max_new_tokens, self.params, mode=self.rollout, draft=self.mtp,
                     draft_len=self.draft_len, max_draft_len=self.max_draft_len, seed=seed)
        return {"tokens": [r.tokens for r in g.rollouts], "logprobs": [r.logprobs for r in g.rollouts],
                "entropies": [r.entropies for r in g.rollouts], "stats": g.stats.summary(),
                "version": self.version, "rollout_s": time.perf_counter() - t0}

    def draft_state(self) -> dict | None:
        """A history draft's state, alone or in a hybrid (its rollouts and calibration, for the run's
        checkpoint), else None."""
        history = history_of(self.mtp)
        return None if history is None else history.state()

    def submit(self, prompts: list[list[int]], max_new_tokens: int, seed: int | list[int], learn: bool = True) -> None:
        self._pending = self.generate(prompts, max_new_tokens, seed, learn)

    def reply(self) -> dict:
        out, self._pending = self._pending, None
        return out

    def close(self) -> None:
        pass


def in_process_worker(spec: dict, dtype: str, rollout: str, draft_len: int | str, max_draft_len: int,
                      temperature: float, threads: int, vllm_args: dict | None = None):
    """The worker a spawned process or a Ray actor runs: bebop's (LocalWorker), or with `vllm_args` vLLM's
    (bebop.backends.vllm.worker.vllm_args, less its "log"), on `threads` cores."""
    if vllm_args is None:
        return LocalWorker(spec, dtype, rollout, draft_len, max_draft_len, temperature)
    return VllmRolloutWorker(spec, dtype, rollout, draft_len, temperature, threads, **vllm_args)
