"""bebop as the rollout engine of TRL's GRPOTrainer (`pip install 'bebop-rl[trl]'`).

    from bebop.integrations.trl import BebopRollout
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                          rollout_func=BebopRollout("smollm2-135m", mode="spec", draft_len=3))

TRL 1.16 calls `rollout_func(prompts, trainer)` with this process's prompts; its RepeatSampler has already
repeated each prompt `num_generations` times in a row, so one completion per entry gives `num_generations` per
prompt, in TRL's order (TRL's vLLM server path relies on the same layout when it takes `prompts[::n]`).
Each call:
  1. sync     whenever `trainer.state.global_step` moved since the last sync, copy the trainer model's
              weights into bebop's Decoder in place (one `copy_` per tensor, casting dtype), as TRL does for
              vLLM (`sync_weights` when the step changed). The MTP draft shares the Decoder's embedding, norm and
              LM head; its cached reduced-vocabulary head slice is rebuilt so the draft never reads stale weights.
  2. prompts  conversational prompts get the trainer's chat template, plain text is tokenized as is, exactly
              as TRL's own generation path tokenizes them (same ids whichever backend generates).
  3. generate bebop's engine at the trainer's temperature / top_p / top_k / max_completion_length, stopping at
              the trainer's EOS ids; row i draws from its own seed (base seed, sample counter), so a sample does
              not depend on the batch it is in.
  4. return   prompt_ids, completion_ids, logprobs, plus the acceptance statistics as extra fields (TRL hands
              extra fields to the reward functions). `logprobs` are log p(token) under the distribution the
              token was sampled from (after temperature, top-k, top-p): what TRL asks vLLM for
              (`--logprobs-mode processed_logprobs`), and equal to the trainer's own recomputation
              (log_softmax(logits / temperature)) when top-k and top-p are off.
Timings and acceptance go into TRL's metrics (`bebop/...`), averaged and logged with TRL's own at each
logging step.
"""

import os
import tempfile
import time

import torch
from trl.data_utils import is_conversational

from bebop.backends.vllm.engine import installed
from bebop.backends.vllm.worker import DRAFT_CHECK_TOL, vllm_args
from bebop.drafts.base import Draft, draft_or_old_mtp
from bebop.drafts.registry import default_draft, load_draft, shipped_draft
from bebop.engine.generation import MODES, generate
from bebop.engine.memory import retain_freed_memory
from bebop.errors import BebopError
from bebop.models import DTYPES
from bebop.models.decoder import Decoder, convert_hf_state_dict
from bebop.models.registry import DEFAULT_MODEL, hf_dir, load_model
from bebop.rl.config import RLConfig
from bebop.rl.sync import check_sync, mtp_state, policy_state
from bebop.rl.workers.process import WorkerProcess
from bebop.sampling import SamplingParams
from bebop.seeds import row_seeds


def weight_pairs(decoder: Decoder, hf_model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(destination view in `decoder`, source parameter of `hf_model`) for every weight, so that a sync is one
    in-place copy per source tensor and allocates nothing.

    The name mapping stays `convert_hf_state_dict`'s alone: it is run once on stand-ins whose entries are
    (source number, row) codes, and each converted tensor's codes say which rows of which source fill which
    rows of the destination (the conversion only renames and concatenates along dim 0)."""
    sources = {k: v for k, v in hf_model.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
    names = list(sources)
    stand_ins = {k: torch.arange(v.shape[0]) + (i << 32) for i, (k, v) in enumerate(sources.items()) if v.dim()}
    mismatch = "the trainer's model does not match bebop's model: "
    try:
        codes = convert_hf_state_dict(stand_ins, decoder.cfg)
    except KeyError as e:
        raise BebopError(f"{mismatch}it has no weight {e}") from None
    targets = dict(decoder.named_parameters())  # a tied LM head appears once, as the embedding
    pairs = []
    for name, code in codes.items():
        if name not in targets or len(code) != targets[name].shape[0]:
            raise BebopError(f"{mismatch}{name} has {len(code)} rows there, "
                             f"{tuple(targets[name].shape) if name in targets else 'no such weight'} here")
        dst, start = targets[name].data, 0
        for src_index in code.div(1 << 32, rounding_mode="floor").unique_consecutive().tolist():
            src = sources[names[src_index]]  # the Parameter itself: its current data at every copy
            rows = torch.arange(src.shape[0]) + (src_index << 32)
            if dst.shape[1:] != src.shape[1:] or not torch.equal(code[start:start + src.shape[0]], rows):
                raise BebopError(f"{mismatch}{names[src_index]} {tuple(src.shape)} there, "
                                 f"{name} {tuple(dst.shape)} here")
            pairs.append((dst[start:start + src.shape[0]], src))
            start += src.shape[0]
    return pairs


class BebopRollout:
    """A TRL `rollout_func` that generates with bebop.

    model: a registry name (`smollm2-135m`, `tiny-llama`, ...), a local model directory, or a transformers model
    (its weights are copied; the trainer's model is the weight source at every sync anyway).
    mode: `spec` (default), `spec-greedy` or `ar`; draft_len: drafts per step, or "auto" (chosen every step by
    cost, bebop.engine.draft_len); draft: None (the model's shipped trained draft, else a fresh seeded MTP:
    bebop.drafts.registry.default_draft), a checkpoint path, an EAGLE-3 directory or a Draft (`mtp=` is its old name).
    dtype: None ("auto" for a name: bfloat16 where this machine runs it faster; the model's own dtype for a
    transformers model) or a dtype name as bebop.models.registry.load_model takes it.
    max_batch: at most this many rows decoding at once (continuous batching); None = all of the call's prompts.
    seed: base of the per-sample seeds; None = the trainer's `args.seed`.
    device: where a model given by name runs (bebop.models.devices: auto, cpu, cuda, cuda:N); a transformers
    model's decoder goes where its weights are.
    backend: "bebop" (bebop's engine, the default) or "vllm": vLLM generates instead (bebop.backends.vllm.worker, in a
    process of its own, started at the first call), with the draft's EAGLE-3 export (default: the model's
    shipped EAGLE-3 draft) and a fixed draft_len; every sync writes bebop's copy of the weights into vLLM in
    place and checks that vLLM computes what they compute. The model must be a name or directory vLLM can load."""

    def __init__(self, model=DEFAULT_MODEL, mode: str = "spec", draft_len: int | str = "auto", dtype: str | None = None,
                 draft: str | Draft | None = None, max_batch: int | None = None, seed: int | None = None,
                 progress: bool = False, backend: str = "bebop", device: str = "auto", *,
                 mtp: str | Draft | None = None):
        draft = draft_or_old_mtp(draft, mtp, "BebopRollout")
        if mode not in MODES:
            raise BebopError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
        if backend not in ("bebop", "vllm"):
            raise BebopError(f"unknown backend '{backend}' (choose from bebop, vllm)")
        self.backend, self.worker, self.model_dir = backend, None, None
        if backend == "vllm":
            if not installed():
                raise BebopError("backend='vllm' needs vLLM: pip install 'bebop-rl[vllm]'")
            if mode != "ar" and not isinstance(draft_len, int):
                raise BebopError("backend='vllm' needs a fixed draft_len (vLLM's num_speculative_tokens; it has no auto)")
            path = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "")
            self.model_dir = str(hf_dir(path))  # a model vLLM can load from disk, or one error line
        if max_batch is not None and max_batch < 1:
            raise BebopError(f"max_batch must be >= 1, got {max_batch}")
        if isinstance(model, str):
            self.decoder, _ = load_model(model, dtype=dtype or "auto", device=device)  # it checks both
        else:
            try:
                self.decoder = Decoder.from_hf(model)
            except ValueError as e:
                raise BebopError(f"cannot use this model with bebop: {e}") from None
            self.decoder.name = getattr(model.config, "_name_or_path", None)
            if dtype is not None:
                if dtype not in DTYPES:
                    raise BebopError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPES)})")
                self.decoder.to(DTYPES[dtype])
        self.mode, self.draft_len, self.max_batch, self.seed, self.progress = mode, draft_len, max_batch, seed, progress
        retain_freed_memory()  # this process will run the engine (bebop.engine.memory)
        self.mtp = None
        if mode != "ar" and backend == "vllm" and draft is None:
            self.mtp = shipped_draft(self.decoder, "eagle3")
            if self.mtp is None:
                raise BebopError("backend='vllm' needs an EAGLE-3 draft (draft=...): this model ships none")
        elif mode != "ar":
            self.mtp = (draft if isinstance(draft, Draft) else load_draft(draft, self.decoder) if draft
                        else default_draft(self.decoder))
        self.pairs = None  # built on the first sync, against the trainer's model
        self.synced_step = None
        self.samples = 0  # samples generated so far: the per-sample seed counter

    # ----- 1. weight sync -----
    @torch.no_grad()
    def sync_weights(self, hf_model) -> float:
        """Copy `hf_model`'s current weights into the Decoder in place; returns the seconds it took."""
        start = time.perf_counter()
        if self.pairs is None:
            self.pairs = weight_pairs(self.decoder, hf_model)
        for dst, src in self.pairs:
            dst.copy_(src)
        if self.mtp is not None:  # the draft head is a slice copy of the LM head when its vocabulary is reduced
            self.mtp.set_draft_vocab(self.mtp.vocab_ids if len(self.mtp.vocab_ids) else None)
        return time.perf_counter() - start

    # ----- 2. prompts -----
    @staticmethod
    def prompt_ids(prompts: list, trainer) -> list[list[int]]:
        """Token ids of each prompt, as TRL's `_tokenize_prompts` makes them for its own generation."""
        tok = trainer.processing_class
        if is_conversational({"prompt": prompts[0]}):
            ids = tok.apply_chat_template(conversation=prompts, chat_template=getattr(trainer, "chat_template", None),
                                          add_generation_prompt=True, tokenize=True, return_dict=True,
                                          **(getattr(trainer, "chat_template_kwargs", None) or {}))["input_ids"]
        else:
            ids = tok(text=prompts)["input_ids"]
        return [list(map(int, i)) for i in ids]

    def sampling_params(self, trainer) -> SamplingParams:
        if trainer.min_p not in (None, 0.0):
            raise BebopError(f"bebop rollouts do not support min_p (got {trainer.min_p})")
        if trainer.repetition_penalty != 1.0:
            raise BebopError(f"bebop rollouts do not support repetition_penalty (got {trainer.repetition_penalty})")
        try:
            return SamplingParams(temperature=trainer.temperature, top_p=trainer.top_p, top_k=trainer.top_k or 0)
        except ValueError as e:
            raise BebopError(str(e)) from None

    # ----- vLLM as the engine (backend="vllm") -----
    def start_vllm(self, trainer, probe_ids: list[int]) -> None:
        """vLLM in a process of its own (bebop.rl.workers.process.WorkerProcess), sampling at the trainer's
        temperature and EOS; its log and the draft's export go to a fresh temporary directory."""
        if trainer.top_p != 1.0 or trainer.top_k:
            raise BebopError("backend='vllm' samples with temperature only here: set top_p=1.0 and top_k=0")
        self.decoder.eos_ids = list(trainer.eos_token_ids)
        cfg = RLConfig(model=self.model_dir, rollout=self.mode, rollout_backend="vllm", temperature=trainer.temperature,
                       draft_len=self.draft_len if self.mode != "ar" else 1, seed=trainer.args.seed)
        out = tempfile.mkdtemp(prefix="bebop-trl-vllm-")
        dtype = str(self.decoder.embed.weight.dtype).removeprefix("torch.")
        self.worker = WorkerProcess(self.decoder, self.mtp, cfg, dtype, len(os.sched_getaffinity(0)),
                                    vllm_args(cfg, self.mtp, out, self.decoder.max_len))
        self.probe_ids, self.dtype = probe_ids, dtype

    def sync_vllm(self, step: int, first: bool) -> None:
        """bebop's copy of the weights (just synced) into vLLM (the frozen draft's only at the first sync), then
        the check that vLLM computes what they compute (bebop.rl.sync.check_sync)."""
        self.worker.load_weights(policy_state(self.decoder), mtp_state(self.mtp) if first else {}, step)
        check_sync(self.worker, self.decoder, self.probe_ids, self.dtype, DRAFT_CHECK_TOL)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

    # ----- the rollout function -----
    def __call__(self, prompts: list, trainer) -> dict:
        metrics = trainer._metrics["train" if trainer.model.training else "eval"]  # TRL's own metric buffer
        step = trainer.state.global_step
        prompt_ids = self.prompt_ids(prompts, trainer)
        if self.backend == "vllm" and self.worker is None:
            self.start_vllm(trainer, prompt_ids[0])
        if step != self.synced_step:
            seconds = self.sync_weights(trainer.accelerator.unwrap_model(trainer.model))
            if self.backend == "vllm":
                start = time.perf_counter()
                self.sync_vllm(step, first=self.synced_step is None)
                seconds += time.perf_counter() - start
            metrics["bebop/weight_sync_time"].append(seconds)
            self.synced_step = step
        params = self.sampling_params(trainer)
        base = trainer.args.seed if self.seed is None else self.seed
        seeds = row_seeds(base, len(prompt_ids), first=self.samples)
        self.samples += len(prompt_ids)

        start = time.perf_counter()
        if self.backend == "vllm":
            self.worker.submit(prompt_ids, trainer.max_completion_length, seeds)
            got = self.worker.reply()
            completions, logprobs, summary = got["tokens"], got["logprobs"], got["stats"]
        else:
            try:  # one engine call: continuous batching keeps at most max_batch rows decoding at once
                g = generate(self.decoder, prompt_ids, trainer.max_completion_length, params, mode=self.mode,
                             draft=self.mtp, draft_len=self.draft_len, seed=seeds, eos_ids=list(trainer.eos_token_ids),
                             progress=self.progress, max_batch=self.max_batch)
            except ValueError as e:
                raise BebopError(str(e)) from None
            completions, logprobs = [r.tokens for r in g.rollouts], [r.logprobs for r in g.rollouts]
            summary = g.stats.summary()
        metrics["bebop/generation_time"].append(time.perf_counter() - start)

        extra = {"acceptance_rate": summary["acceptance_rate"],
                 "mean_acceptance_length": summary["mean_acceptance_length"],
                 # a tuple, not a list: TRL would hand a list's items out one per completion
                 "per_position_acceptance": tuple(summary["per_position_acceptance"])}
        for key in ("acceptance_rate", "mean_acceptance_length", "mean_entropy"):  # entropy bounds acceptance
            if summary[key] is not None:
                metrics[f"bebop/{key}"].append(summary[key])
        for i, a in enumerate(extra["per_position_acceptance"]):
            metrics[f"bebop/per_position_acceptance/{i}"].append(a)
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": logprobs, **extra}
