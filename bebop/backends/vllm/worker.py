"""vLLM as the rollout engine of `bebop rl` (`--rollout-backend vllm`): a rollout worker with the same plain-data
interface as bebop's own (bebop.rl.workers.base), run inside the rollout process or Ray actor the RL loop starts.

vLLM runs in that process itself (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one CPU worker, as TRL's colocate mode),
so a weight sync is a copy from the trainer's shared-memory tensors into vLLM's parameters, no file and no
serialisation:
  1. write    each bebop tensor into the vLLM parameter of the same layout (vLLM fuses q,k,v and gate,up as
              bebop does), in place: the tied LM head is the embedding's tensor, and vLLM pads vocabularies.
              vLLM's CPU linears pack their weight for oneDNN and free the parameter: those get a fresh one;
  2. repack   `quant_method.process_weights_after_loading` on every layer that holds a weight, as vLLM's own
              loader does: packed linears, and the tied LM head whose packed copy reads the embedding;
  3. reset    the prefix cache (its blocks were computed with the old weights);
  4. check    vLLM's log-probs of a fixed probe sequence against the trainer's (bebop.rl.sync.check_sync), and
              every draft linear against the weights it should hold: a sync that leaves the policy or the draft
              stale stops the run instead of corrupting it.
The EAGLE-3 draft is vLLM's drafter (`model_runner.drafter.model`); it shares the policy's embedding module
(vLLM shares it when the checkpoint has none, as bebop's drafts do), and with an online MTP strategy its own
weights are written the same way.

Rollouts: per-request seeds (row b of a batch with seed s draws from s * 1_000_003 + b, as bebop's engine
seeds its rows), the sampled tokens' log-probs of the distribution actually sampled (`processed_logprobs`),
EOS tokens kept at the end of a completion as bebop's engine keeps them, acceptance from vLLM's own counters
diffed around the batch. vLLM does not return entropies: the trainer's recomputation stands in for them.
Nothing here imports vLLM until a worker starts.
"""

import os
import time
from pathlib import Path

import torch

from bebop.engine.stats import SpecStats
from bebop.errors import BebopError
from bebop.seeds import row_seeds
from bebop.backends.vllm.engine import installed
from bebop.drafts.formats import export_eagle3
from bebop.models import cpu
from bebop.models.registry import hf_dir

# bebop module name -> vLLM's, inside one decoder layer (Llama, Qwen and EAGLE-3 alike)
LAYER_NAMES = {"wqkv": "self_attn.qkv_proj", "wo": "self_attn.o_proj", "q_norm": "self_attn.q_norm",
               "k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
               "w13": "mlp.gate_up_proj", "w2": "mlp.down_proj",
               "enorm": "input_layernorm", "hnorm": "hidden_norm"}  # EAGLE-3: embedding and hidden-state norms
TOP_NAMES = {"embed": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head", "fc": "model.fc"}
DRAFT_CHECK_TOL = 0.05  # max relative error of a draft linear's output against bebop's weights


def vllm_name(name: str) -> str:
    """`layers.3.wqkv.weight` -> `model.layers.3.self_attn.qkv_proj.weight`; an EAGLE-3 draft's `blocks.0.*`
    and `enorm`/`hnorm`/`fc` map into vLLM's `model.layers.0.*` and `model.fc`."""
    parts = name.split(".")
    if parts[0] in ("layers", "blocks"):
        return ".".join(["model.layers", parts[1], LAYER_NAMES[parts[2]], *parts[3:]])
    if parts[0] in ("enorm", "hnorm"):
        return ".".join(["model.layers.0", LAYER_NAMES[parts[0]], *parts[1:]])
    return ".".join([TOP_NAMES[parts[0]], *parts[1:]])


@torch.no_grad()
def write_weights(model: torch.nn.Module, tensors: dict) -> None:
    """Steps 1 and 2 above for one vLLM model; returns the names of vLLM's weights that `tensors` did not
    write (a weight bebop does not send would stay stale: the caller refuses any it does not expect)."""
    modules = dict(model.named_modules())
    own = {k for k, _ in model.named_parameters()}
    written = set()
    for name, t in tensors.items():
        target = vllm_name(name)
        module_name, _, attr = target.rpartition(".")
        module = modules.get(module_name)
        param = getattr(module, attr, None) if module is not None else None
        if param is None:
            raise BebopError(f"vLLM's model has no weight {target} (bebop's {name})")
        if param.numel() == 0:  # vLLM's CPU linear packed this weight and freed the parameter: give it one again
            setattr(module, attr, torch.nn.Parameter(t.to(param.dtype, copy=True), requires_grad=False))
        elif param.shape[1:] == t.shape[1:] and len(param) >= len(t):  # in place (the tied LM head is this
            param.data[:len(t)].copy_(t)                                # tensor); vLLM pads vocabularies to 64
        else:
            raise BebopError(f"vLLM's {target} is {tuple(param.shape)}, bebop's {name} {tuple(t.shape)}")
        written.add(target)
    for module in modules.values():  # repack what holds a weight (a packed linear not written holds none)
        method, weight = getattr(module, "quant_method", None), getattr(module, "weight", None)
        if method is not None and isinstance(weight, torch.Tensor) and weight.numel():
            method.process_weights_after_loading(module)
    return own - written


def check_draft(drafter: torch.nn.Module, tensors: dict, seed: int = 0) -> float:
    """The largest relative error of vLLM's draft linears (their packed form included) on a random input,
    against the same products with the weights bebop holds: small for the weights sent, of order 1 for a stale
    or foreign draft."""
    modules = dict(drafter.named_modules())
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for name, w in tensors.items():
        if w.dim() != 2 or name.startswith("embed"):
            continue
        module = modules[vllm_name(name).rpartition(".")[0]]
        x = torch.randn(4, w.shape[1], generator=g).to(w.dtype)
        got = module.quant_method.apply(module, x)[:, :len(w)]  # (the LM head has no forward of its own; padded)
        want = x.float() @ w.float().T
        worst = max(worst, float((got.float() - want).norm() / want.norm().clamp_min(1e-12)))
    return worst


class VllmRolloutWorker:
    """vLLM behind the RolloutWorker interface (bebop.rl.workers.base). `spec` is a model spec
    (bebop.rl.sync.model_spec; its eos_ids are read); `model_dir` the policy's Hugging Face directory (its
    architecture and tokenizer: the weights come from the trainer at the first sync); `draft_dir` an EAGLE-3
    export for the speculative rollouts."""

    def __init__(self, spec: dict, dtype: str, rollout: str, draft_len: int, temperature: float, threads: int,
                 model_dir: str, draft_dir: str | None, max_model_len: int, seed: int, first_core: int | None = None):
        cores = sorted(os.sched_getaffinity(0))  # the last `threads` (the trainer's are the others), or from first_core
        cores = cores[-threads:] if first_core is None else cores[first_core:first_core + threads]
        os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
                           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        cpu.show_vllm_this_capability()  # (vLLM runs in this process)
        from vllm import LLM

        speculative = None
        if rollout != "ar":
            speculative = {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": draft_len,
                           "draft_sample_method": "greedy" if rollout == "spec-greedy" else "probabilistic"}
        self.llm = LLM(model=model_dir, dtype=dtype, speculative_config=speculative, seed=seed,
                       logprobs_mode="processed_logprobs", disable_log_stats=False, enforce_eager=True,
                       gpu_memory_utilization=0.4, max_model_len=max_model_len, enable_prefix_caching=True)
        self.eos_ids, self.temperature = list(spec["eos_ids"]), temperature
        self.speculative, self.draft = speculative is not None, None
        self.version = -1

    def load_weights(self, policy: dict, mtp: dict, version: int) -> None:
        """Write the policy (and, when given, the draft's weights) into vLLM, in place."""
        def write(worker):
            stale = write_weights(worker.model_runner.model, policy)
            stale = {k for k in stale if not k.startswith("lm_head")}  # a tied head is the embedding, written
            if mtp:
                write_weights(worker.model_runner.drafter.model, mtp)
            return sorted(stale)

        stale = self.llm.collective_rpc(write)[0]
        if stale:
            raise BebopError(f"vLLM's model has weights bebop does not sync: {', '.join(stale[:4])}")
        self.llm.reset_prefix_cache()
        if mtp:
            self.draft = {k: v.clone() for k, v in mtp.items()}
        self.version = version

    def draft_state(self) -> None:
        return None  # vLLM's drafts are models, whose weights the trainer holds

    def probe(self, ids: list[int]) -> dict:
        """Step 4's evidence: log p(ids[t] | ids[:t]) at temperature 1 as vLLM computes it, and the draft
        check (None without a draft)."""
        from vllm import SamplingParams

        out = self.llm.generate([{"prompt_token_ids": ids}],
                                SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0), use_tqdm=False)
        logprobs = [d[t].logprob for d, t in zip(out[0].prompt_logprobs[1:], ids[1:])]
        draft, error = self.draft, None
        if self.speculative and draft is not None:
            error = self.llm.collective_rpc(lambda worker: check_draft(worker.model_runner.drafter.model, draft))[0]
        return {"logprobs": logprobs, "draft_error": error}

    def generate(self, prompts: list[list[int]], max_new_tokens: int, seed: int | list[int]) -> dict:
        """`seed`: the batch's (row b draws from seed * 1_000_003 + b) or one per row."""
        from vllm import SamplingParams

        from bebop.backends.vllm.engine import counters_between, spec_counters

        t0 = time.perf_counter()
        seeds = seed if isinstance(seed, list) else row_seeds(seed, len(prompts))
        params = [SamplingParams(temperature=self.temperature, max_tokens=max_new_tokens, logprobs=0, seed=s % 2**63,
                                 stop_token_ids=self.eos_ids, detokenize=False) for s in seeds]
        before = spec_counters(self.llm.get_metrics())
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        delta = counters_between(before, spec_counters(self.llm.get_metrics()))
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [[d[t].logprob for d, t in zip(o.outputs[0].logprobs, toks)] for o, toks in zip(outputs, tokens)]
        stats = SpecStats.from_vllm(delta)
        stats.tokens = sum(map(len, tokens))
        return {"tokens": tokens, "logprobs": logprobs, "entropies": None, "stats": stats.summary(), "version": self.version,
                "rollout_s": time.perf_counter() - t0}

    def submit(self, prompts: list[list[int]], max_new_tokens: int, seed: int | list[int], learn: bool = True) -> None:
        self._pending = self.generate(prompts, max_new_tokens, seed)

    def reply(self) -> dict:
        out, self._pending = self._pending, None
        return out

    def close(self) -> None:
        pass  # vLLM goes with the process it runs in


def vllm_args(cfg, mtp, out, max_model_len: int) -> dict:
    """What the worker process needs beyond bebop's own worker's: the policy's Hugging Face directory, the draft
    exported as EAGLE-3 into the run directory (vLLM loads drafts from disk), the log file. Refuses, with one
    line and before anything starts, what vLLM cannot run. `cfg` needs rollout, model and seed (an RLConfig)."""
    if not installed():
        raise BebopError("--rollout-backend vllm needs vLLM: pip install 'bebop-rl[vllm]'")
    draft = None
    if cfg.rollout != "ar":
        draft = str(export_eagle3(mtp, Path(out) / "vllm-draft"))  # refuses a DeepSeek-layout MTP
    return {"model_dir": str(hf_dir(cfg.model)), "draft_dir": draft, "log": str(Path(out) / "vllm.log"),
            "max_model_len": -(-max_model_len // 256) * 256, "seed": cfg.seed}
