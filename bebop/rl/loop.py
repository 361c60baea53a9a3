"""The RL loop: rollouts -> rewards -> GRPO update -> (online MTP update) -> weight sync, synchronous or
one step off-policy.

Rollout side: a `RolloutWorker` owns a copy of the policy (and MTP) in the rollout dtype and generates with the
engine. Every message across its boundary is plain data (token lists, floats, dicts of tensors for weights), so
a Ray actor could stand in for `WorkerProcess` later.

  off       generate batch n with weights n, train on it, sync: one phase at a time, each with every thread.
  one-step  (verl's one_step_off_policy) the worker process generates batch n+1 with weights n while the
            trainer process trains on batch n (generated with weights n-1), each with its own thread budget;
            then the trainer writes weights n+1 into shared memory and the worker copies them in.
Batch n's prompts and sampling seeds depend only on (seed, n), never on timing, so both modes and a resumed
run see the same data; GRPO's truncated importance weight corrects for the rollout side's older weights and
its bf16 numerics.
"""

import copy
import json
import math
import os
import queue
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from bebop import io as checkpoint
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.engine.memory import retain_freed_memory
from bebop.drafts.registry import Draft as MTP, build_draft
from bebop.models import cpu
from bebop.models.decoder import Decoder
from bebop.models.registry import probed_choice, probed_compiled, probed_kernels
from bebop.rl import grpo
from bebop.rl.config import RLConfig
from bebop.rl.trainer import MTP_LOSS, Sample, mtp_step, policy_step, probe_bf16
from bebop.sampling import SamplingParams

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# ----- the rollout side -----

def policy_state(model: Decoder) -> dict:
    """Weights to ship: named parameters (a tied head appears once, as the embedding)."""
    return {k: v.detach() for k, v in model.named_parameters()}


def mtp_state(mtp: MTP | None) -> dict:
    return {} if mtp is None else {k: v.detach() for k, v in mtp.state_dict().items() if k != "vocab_ids"}


def model_spec(policy: Decoder, mtp: MTP | None, dtype: str) -> dict:
    """What a worker needs to build empty copies of the policy and MTP in `dtype` (plain, picklable data),
    with the kernels this machine's probe chose for that dtype."""
    attention, linear = probed_kernels(policy, dtype)
    return {"cfg": policy.cfg, "name": policy.name, "eos_ids": list(policy.eos_ids), "attention": attention,
            "linear": linear, "compiled": probed_compiled(policy, dtype), "device": str(policy.embed.weight.device),
            "mtp": None if mtp is None else {"config": copy.deepcopy(mtp.config), "vocab_ids": mtp.vocab_ids.tolist()}}


class RolloutWorker:
    """Generates completions with its own copy of the weights. `load_weights` copies weights in (any dtype);
    `generate` returns plain data."""

    def __init__(self, spec: dict, dtype: str, rollout: str, draft_len: int | str, max_draft_len: int,
                 temperature: float):
        self.model = Decoder(spec["cfg"], max_len=4096).to(spec["device"], DTYPES[dtype]).eval().requires_grad_(False)
        self.model.name, self.model.eos_ids = spec["name"], spec["eos_ids"]
        self.model.attention, self.model.linear = spec["attention"], spec["linear"]
        self.model.compiled = spec.get("compiled", False)
        self.mtp = None
        if spec["mtp"] is not None:
            self.mtp = build_draft(self.model, copy.deepcopy(spec["mtp"]["config"])).to(spec["device"], DTYPES[dtype])
            self.mtp.requires_grad_(False).eval()
            ids = spec["mtp"]["vocab_ids"]
            self.mtp.set_draft_vocab(torch.tensor(ids) if ids else None)
        self.rollout, self.draft_len, self.max_draft_len = rollout, draft_len, max_draft_len
        self.params = SamplingParams(temperature)
        self.version = -1

    @torch.no_grad()
    def load_weights(self, policy: dict, mtp: dict, version: int) -> None:
        own = dict(self.model.named_parameters())
        for k, v in policy.items():
            own[k].copy_(v)
        if self.mtp is not None:
            own = self.mtp.state_dict()
            for k, v in mtp.items():
                own[k].copy_(v)
            # the draft head is a cached slice of the policy's head: rebuild it from the weights just loaded
            self.mtp.set_draft_vocab(self.mtp.vocab_ids if len(self.mtp.vocab_ids) else None)
        self.version = version

    @torch.no_grad()
    def probe(self, ids: list[int]) -> dict:
        """log p(ids[t] | ids[:t]) at temperature 1 with the weights loaded (the trainer checks the sync)."""
        logits = self.model.logits(self.model.forward_full(torch.tensor([ids], device=self.model.embed.weight.device)))
        return {"logprobs": token_logprobs(logits[0], ids), "draft_error": None}  # the draft's weights are copies

    def generate(self, prompts: list[list[int]], max_new_tokens: int, seed: int) -> dict:
        t0 = time.perf_counter()
        g = generate(self.model, prompts, max_new_tokens, self.params, mode=self.rollout, mtp=self.mtp,
                     draft_len=self.draft_len, max_draft_len=self.max_draft_len, seed=seed)
        return {"tokens": [r.tokens for r in g.rollouts], "logprobs": [r.logprobs for r in g.rollouts],
                "entropies": [r.entropies for r in g.rollouts], "stats": g.stats.summary(),
                "version": self.version, "rollout_s": time.perf_counter() - t0}


def token_logprobs(logits: torch.Tensor, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 from logits [T, V] at temperature 1."""
    logp = torch.log_softmax(logits[:-1].float(), -1)
    return logp.gather(-1, torch.tensor(ids[1:], device=logits.device).unsqueeze(-1)).squeeze(-1).tolist()


def worker_main(spec, dtype, rollout, draft_len, max_draft_len, temperature, threads, shared_policy, shared_mtp,
                inbox, outbox, vllm_args=None):
    """The worker process: a RolloutWorker (or, with `vllm_args`, a VllmRolloutWorker whose log goes to
    vllm_args["log"]) serving plain-data requests until 'stop'."""
    torch.set_num_threads(threads)
    retain_freed_memory()  # a spawned process: malloc starts untuned here (bebop.engine.memory)
    try:
        if vllm_args is None:
            worker = RolloutWorker(spec, dtype, rollout, draft_len, max_draft_len, temperature)
        else:
            from bebop.backends.vllm.worker import VllmRolloutWorker

            log = os.open(vllm_args.pop("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)  # vLLM's log lines: into the run's vllm.log, not over the trainer's progress bar
            os.dup2(log, 2)
            worker = VllmRolloutWorker(spec, dtype, rollout, draft_len, temperature, threads, **vllm_args)
        outbox.put({"ready": True})
        trainer = os.getppid()
        while True:
            try:
                kind, arg = inbox.get(timeout=5)
            except queue.Empty:  # a trainer killed (SIGKILL) cannot say 'stop': do not outlive it
                if os.getppid() != trainer:
                    return
                continue
            if kind == "stop":
                return
            if kind == "load":
                t0 = time.perf_counter()
                version, with_mtp = arg
                worker.load_weights(shared_policy, shared_mtp if with_mtp else {}, version)
                outbox.put({"loaded": version, "load_s": time.perf_counter() - t0})
            elif kind == "probe":
                outbox.put(worker.probe(arg))
            elif kind == "generate":
                outbox.put(worker.generate(**arg))
    except Exception as e:  # surface the worker's failure in the trainer instead of hanging it
        line = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        outbox.put({"error": traceback.format_exc(), "line": line, "bebop": isinstance(e, BebopError)})


class WorkerProcess:
    """A RolloutWorker in a spawned process. Weights travel through shared-memory tensors (written by the
    trainer, copied in by the worker on 'load'): no file round-trip, no pickling of weights per step."""

    def __init__(self, policy, mtp, cfg: RLConfig, dtype: str, threads: int, vllm_args: dict | None = None):
        ctx = mp.get_context("spawn")
        self.log = vllm_args and vllm_args["log"]
        dt = DTYPES[dtype]
        self.shared_policy = {k: v.to(dt).clone().share_memory_() for k, v in policy_state(policy).items()}
        self.shared_mtp = {k: v.to(dt).clone().share_memory_() for k, v in mtp_state(mtp).items()}
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=worker_main, daemon=True,
                                args=(model_spec(policy, mtp, dtype), dtype, cfg.rollout, cfg.draft_len,
                                      cfg.max_draft_len, cfg.temperature, threads, self.shared_policy, self.shared_mtp,
                                      self.inbox, self.outbox, vllm_args))
        self.proc.start()
        self.reply()

    def reply(self) -> dict:
        while True:
            try:
                msg = self.outbox.get(timeout=5)
                break
            except Exception:  # queue.Empty: check the worker is still alive
                if not self.proc.is_alive():
                    where = f"; log: {self.log}" if self.log else ""
                    raise BebopError(f"the rollout worker died (exit code {self.proc.exitcode}){where}") from None
        if "error" in msg and self.log:  # vLLM's failure: one line, its traceback in the run's vllm.log
            with open(self.log, "a") as f:
                f.write(msg["error"])
            raise BebopError(f"the vLLM rollout worker failed: {msg['line']} (log: {self.log})")
        if "error" in msg:
            if msg["bebop"]:
                raise BebopError(msg["line"].removeprefix("BebopError: "))
            raise RuntimeError("rollout worker failed:\n" + msg["error"])
        return msg

    @torch.no_grad()
    def load_weights(self, policy: dict, mtp: dict, version: int) -> None:
        for k, v in policy.items():
            self.shared_policy[k].copy_(v)
        for k, v in mtp.items():
            self.shared_mtp[k].copy_(v)
        self.inbox.put(("load", (version, bool(mtp))))
        self.reply()

    def submit(self, prompts, max_new_tokens, seed) -> None:
        self.inbox.put(("generate", {"prompts": prompts, "max_new_tokens": max_new_tokens, "seed": seed}))

    def probe(self, ids: list[int]) -> dict:
        self.inbox.put(("probe", ids))
        return self.reply()

    def close(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(("stop", None))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


class LocalWorker(RolloutWorker):
    """The synchronous baseline: the same worker in this process, with submit/reply for a uniform loop."""

    def submit(self, prompts, max_new_tokens, seed) -> None:
        self._pending = self.generate(prompts, max_new_tokens, seed)

    def reply(self) -> dict:
        out, self._pending = self._pending, None
        return out

    def close(self) -> None:
        pass


# ----- the check after every sync -----

# mean |log p_rollout - log p_trainer| over the probe's tokens that a sync may leave: the rollout side's numerics
# (bf16 weights, other kernels) cost about what bf16 rounding alone costs the trainer's own forward (its
# "rounding gap"), which grew from 0.05 to 0.14 nats as GRPO sharpened the policy (issue 26, steps 0 to 50;
# bebop's engine was off by exactly that, vLLM's by 0.06 at step 0); weights a sync missed cost far more (50
# steps behind: 0.68). So the tolerance is the larger of a floor and twice the rounding gap measured at the check.
SYNC_PROBE_TOL = {"bfloat16": 0.15, "float32": 0.01}
SYNC_GAP_FACTOR = 2.0


@torch.no_grad()
def check_sync(worker, policy: Decoder, probe_ids: list[int], dtype: str, draft_tol: float) -> dict:
    """Step 4 of a sync: the rollout side's probe log-probs against the trainer's (and its draft check). A
    rollout engine that did not take the new weights stops the run with one line, instead of sampling from a
    policy the trainer does not have. Where the rollout dtype is not the trainer's, a copy of the trainer's
    weights in that dtype scores the probe too, once the error passes the floor (SYNC_PROBE_TOL): how far rounding
    alone moves it (sync_rounding_gap, None while the floor holds) raises the tolerance (SYNC_GAP_FACTOR). Within
    the floor the copy is not made: it was over half of the check's time (0.82 -> 0.37 s on smollm2-135m)."""
    got = worker.probe(probe_ids)
    got = got if isinstance(got, list) else [got]  # (Ray: one answer per rollout worker, each checked)
    ids = torch.tensor([probe_ids], device=policy.embed.weight.device)
    want = token_logprobs(policy.logits(policy.forward_full(ids))[0], probe_ids)
    gap = lambda a: sum(abs(x - y) for x, y in zip(a, want)) / len(want)  # noqa: E731
    error = max(gap(g["logprobs"]) for g in got)
    rounding_gap = None
    if error > SYNC_PROBE_TOL[dtype]:  # past the floor: is rounding to the rollout dtype alone that far off?
        rounding_gap = 0.0
        if policy.embed.weight.dtype != DTYPES[dtype]:
            rounded = copy.deepcopy(policy).to(DTYPES[dtype])
            rounding_gap = gap(token_logprobs(rounded.logits(rounded.forward_full(ids))[0], probe_ids))
            del rounded
    tol = max(SYNC_PROBE_TOL[dtype], SYNC_GAP_FACTOR * (rounding_gap or 0.0))
    draft_errors = [g["draft_error"] for g in got if g["draft_error"] is not None]
    draft_error = max(draft_errors) if draft_errors else None
    if error > tol:
        raise BebopError(f"the rollout engine's weights are not the trainer's after a sync: probe log-probs differ by "
                         f"{error:.3f} nats per token (tolerance {tol:.3f} in {dtype}: the larger of "
                         f"{SYNC_PROBE_TOL[dtype]} and {SYNC_GAP_FACTOR:g}x the {rounding_gap:.3f} that {dtype} "
                         f"rounding alone costs the trainer's weights)")
    if draft_error is not None and draft_error > draft_tol:
        raise BebopError(f"the rollout engine's draft is not bebop's after a sync: its linears are off by "
                         f"{draft_error:.3f} (relative; tolerance {draft_tol})")
    return {"sync_probe_error": error, "sync_draft_error": draft_error, "sync_rounding_gap": rounding_gap}


# ----- data order -----

def batch_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 17) % (2 ** 31)


def step_prompts(pool: list, prompt_ids: list[list[int]], cfg: RLConfig, step: int):
    """Batch `step`: prompts_per_step tasks in the run's fixed order, each repeated num_generations times."""
    idx = [(step * cfg.prompts_per_step + i) % len(pool) for i in range(cfg.prompts_per_step)]
    tasks = [pool[i] for i in idx for _ in range(cfg.num_generations)]
    return tasks, [prompt_ids[i] for i in idx for _ in range(cfg.num_generations)]


# ----- checkpoints: everything into a fresh directory, then one os.replace of the pointer file -----

def save_checkpoint(out: Path, step: int, policy, mtp, opt, mtp_opt, pending) -> None:
    """Policy (+ the MTP when it trains), optimisers, RNG and the in-flight one-step batch, committed together
    (bebop.io: one directory rename is the commit point)."""
    tensors = {f"policy.{k}": v for k, v in policy_state(policy).items()}
    if mtp is not None:
        tensors.update({f"mtp.{k}": v for k, v in mtp.state_dict().items()})
    state = {"optimizer": opt.state_dict(), "mtp_optimizer": mtp_opt and mtp_opt.state_dict(),
             "torch_rng": torch.get_rng_state(), "pending": pending}
    checkpoint.save_checkpoint(out / "ckpt", step, tensors, state)


def load_checkpoint(out: Path, policy, mtp, opt, mtp_opt) -> dict:
    """Restore what `save_checkpoint` wrote; returns its state with "step" added."""
    ckpt = checkpoint.load_checkpoint(out / "ckpt")
    if ckpt is None:
        raise BebopError(f"cannot resume: no checkpoint in {out}")
    part = lambda prefix: {k[len(prefix):]: v for k, v in ckpt.tensors.items() if k.startswith(prefix)}
    policy.load_state_dict(part("policy."), strict=False)
    if mtp is not None:
        mtp.load_state_dict(part("mtp."))
        mtp.set_draft_vocab(mtp.vocab_ids if len(mtp.vocab_ids) else None)
    opt.load_state_dict(ckpt.state["optimizer"])
    if mtp_opt is not None:
        mtp_opt.load_state_dict(ckpt.state["mtp_optimizer"])
    torch.set_rng_state(ckpt.state["torch_rng"])
    return {**ckpt.state, "step": ckpt.step}


# ----- the run -----

def wilson(k: float, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval for a mean reward in [0, 1] over n samples."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def run_rl(cfg: RLConfig, out, policy: Decoder, tokenizer, train_tasks: list, eval_tasks: list, mtp: MTP | None,
           score=None, resume: bool = False, progress: bool = True) -> list[dict]:
    """Train `policy` (fp32, in place) with GRPO for cfg.steps steps; write DIR/metrics.jsonl, DIR/eval.jsonl,
    DIR/config.json and checkpoints. `score(tasks, texts) -> list[float]` rewards completions (default: each
    task's own reward). Returns the metric rows of the steps run."""
    from bebop.models.registry import chat_ids

    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    score = score or (lambda tasks, texts: [t.reward(c) for t, c in zip(tasks, texts)])
    config = asdict(cfg)
    has_checkpoint = bool(checkpoint.committed(out / "ckpt"))
    if resume and has_checkpoint:
        saved = json.loads((out / "config.json").read_text())
        # (where the rollouts run does not change them: threads, Ray and the number of workers may differ)
        changed = sorted(k for k in config if k not in ("steps", "threads", "ray", "rollout_workers")
                         and saved.get(k, RLConfig.__dataclass_fields__[k].default) != config[k])
        if changed:
            raise BebopError(f"cannot resume {out}: settings differ from the run's ({', '.join(changed)})")
    elif resume:
        raise BebopError(f"cannot resume: no checkpoint in {out}")
    elif has_checkpoint:  # never overwrite a user's run without a word
        raise BebopError(f"{out} holds a run already: pass --resume to continue it, or choose a new --out")
    else:
        for name in ("metrics.jsonl", "eval.jsonl"):
            (out / name).unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))

    total = cfg.total_threads()
    one_step = cfg.async_mode == "one-step"
    train_threads = total - total // 2 if one_step else total
    torch.set_num_threads(train_threads)
    torch.manual_seed(cfg.seed)
    policy.requires_grad_(True).eval()
    ref = copy.deepcopy(policy).requires_grad_(False) if cfg.beta > 0 else None
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    online = cfg.rollout != "ar" and cfg.mtp_strategy in MTP_LOSS
    if cfg.rollout == "ar":
        mtp = None
    mtp_opt = None
    if online:
        mtp.requires_grad_(True)
        mtp_opt = torch.optim.AdamW([p for p in mtp.parameters() if p.requires_grad], lr=cfg.mtp_learning_rate)

    if resume:  # the probes' verdicts are part of the run: a resumed run keeps them
        saved = json.loads((out / "run.json").read_text())
        use_bf16, probe = saved["use_bf16"], "resumed"
        rollout_dtype = saved.get("rollout_dtype", "bfloat16")  # (runs from before "auto" rolled out in bf16)
    else:
        if cfg.autocast == "auto":
            use_bf16, probe = probe_bf16(policy, cfg.micro_batch_size, 64)
        else:
            use_bf16, probe = cfg.autocast == "bf16", None
        rollout_dtype = cfg.rollout_dtype
        if rollout_dtype == "auto":  # what --dtype auto would run the model in (probed once per machine)
            choice = probed_choice(policy, policy.name) if policy.name else None
            rollout_dtype = choice["dtype"] if choice else "float32"
    attention, linear = probed_kernels(policy, rollout_dtype)
    meta = {"use_bf16": use_bf16, "probe": probe, "rollout_dtype": rollout_dtype, "rollout_attention": list(attention),
            "rollout_linear": linear, "rollout_compiled": probed_compiled(policy, rollout_dtype), "train_threads": train_threads, "rollout_threads": total // 2 if one_step else total,
            "rollout_workers": cfg.rollout_workers, "ray": cfg.ray,
            "cpu": cpu.cpu_model(), "cpu_capability": cpu.describe(), "torch": torch.__version__}
    (out / "run.json").write_text(json.dumps(meta, indent=1))

    pool_ids = [chat_ids(tokenizer, t.prompt) for t in train_tasks]
    eval_ids = [chat_ids(tokenizer, t.prompt) for t in eval_tasks]
    start, pending = 0, None
    if resume:
        state = load_checkpoint(out, policy, mtp if online else None, opt, mtp_opt)
        start, pending = state["step"], state["pending"]
        for name in ("metrics.jsonl", "eval.jsonl"):  # drop rows logged after the checkpoint: they are redone
            path = out / name
            if path.exists():
                rows = [r for r in path.read_text().splitlines() if json.loads(r)["step"] <= start]
                path.write_text("".join(r + "\n" for r in rows))

    probe_ids = eval_ids[0] + pool_ids[0]  # a fixed sequence the sync check scores on both sides
    draft_tol, engine_args = float("inf"), None
    rollout_threads = total // 2 if one_step else total
    if cfg.rollout_backend == "vllm":
        from bebop.backends.vllm.worker import DRAFT_CHECK_TOL, vllm_args

        draft_tol = DRAFT_CHECK_TOL
        longest = max(map(len, pool_ids + eval_ids + [probe_ids])) + cfg.max_completion_length
        engine_args = vllm_args(cfg, mtp, out, longest)
    if cfg.ray is not None:
        from bebop.rl.workers.ray import RayWorkers

        worker = RayWorkers(model_spec(policy, mtp, rollout_dtype), cfg, rollout_dtype,
                            max(1, rollout_threads // cfg.rollout_workers), engine_args)
    elif cfg.rollout_backend == "vllm":
        worker = WorkerProcess(policy, mtp, cfg, rollout_dtype, rollout_threads, engine_args)
    elif one_step:
        worker = WorkerProcess(policy, mtp, cfg, rollout_dtype, total // 2)
    else:
        worker = LocalWorker(model_spec(policy, mtp, rollout_dtype), rollout_dtype, cfg.rollout, cfg.draft_len,
                             cfg.max_draft_len, cfg.temperature)
    rows = []
    try:
        worker.load_weights(policy_state(policy), mtp_state(mtp), start)
        check_sync(worker, policy, probe_ids, rollout_dtype, draft_tol)

        def evaluate(step):
            t0 = time.perf_counter()
            worker.submit(eval_ids, cfg.max_completion_length, batch_seed(cfg.seed + 1, 0))
            got = worker.reply()
            texts = [tokenizer.decode(t, skip_special_tokens=True) for t in got["tokens"]]
            r = score(eval_tasks, texts)
            row = {"step": step, "heldout_reward": sum(r) / len(r), "heldout_n": len(r),
                   "heldout_ci95": wilson(sum(r), len(r)), "eval_s": time.perf_counter() - t0}
            with open(out / "eval.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            return row

        if start == 0:
            evaluate(0)
        carry_s = 0.0
        if one_step and pending is None and start < cfg.steps:  # the first batch has nothing to overlap with
            t0 = time.perf_counter()
            worker.submit(step_prompts(train_tasks, pool_ids, cfg, start)[1], cfg.max_completion_length,
                          batch_seed(cfg.seed, start))
            pending = worker.reply()
            carry_s = time.perf_counter() - t0
        bar = tqdm(total=cfg.steps, initial=start, desc=f"rl {cfg.rollout} {cfg.async_mode}", disable=not progress)
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            restarts = getattr(worker, "restarts", 0)  # (Ray's actors: restarted after dying)
            tasks, prompts = step_prompts(train_tasks, pool_ids, cfg, step)
            if one_step:
                got, wait_s = pending, 0.0
                if step + 1 < cfg.steps:  # batch n+1 with weights n, while batch n trains below
                    worker.submit(step_prompts(train_tasks, pool_ids, cfg, step + 1)[1], cfg.max_completion_length,
                                  batch_seed(cfg.seed, step + 1))
            else:
                worker.submit(prompts, cfg.max_completion_length, batch_seed(cfg.seed, step))
                got = worker.reply()
            t_reward = time.perf_counter()
            texts = [tokenizer.decode(t, skip_special_tokens=True) for t in got["tokens"]]
            rewards = torch.tensor(score(tasks, texts), dtype=torch.float32)
            adv = grpo.advantages(rewards, cfg.num_generations, cfg.scale_rewards)
            samples = [Sample(p, t, lp, float(a)) for p, t, lp, a in zip(prompts, got["tokens"], got["logprobs"], adv)]
            reward_s = time.perf_counter() - t_reward
            t_train = time.perf_counter()
            update = policy_step(policy, opt, samples, cfg, use_bf16, ref)
            train_s = time.perf_counter() - t_train
            mtp_train_s, mtp_update = 0.0, {}
            if online:
                t_mtp = time.perf_counter()
                mtp_update = mtp_step(mtp, mtp_opt, policy, samples, cfg, use_bf16)
                mtp.set_draft_vocab(mtp.vocab_ids if len(mtp.vocab_ids) else None)  # the head moved with the policy
                mtp_train_s = time.perf_counter() - t_mtp
            if one_step and step + 1 < cfg.steps:
                t_wait = time.perf_counter()
                pending = worker.reply()
                wait_s = time.perf_counter() - t_wait
            elif one_step:
                pending = None
            t_sync = time.perf_counter()
            worker.load_weights(policy_state(policy), mtp_state(mtp) if online else {}, step + 1)
            sync_s = time.perf_counter() - t_sync
            t_check = time.perf_counter()
            sync = check_sync(worker, policy, probe_ids, rollout_dtype, draft_tol)
            sync["sync_check_s"] = time.perf_counter() - t_check
            step_s = time.perf_counter() - t0 + carry_s
            carry_s = 0.0
            stats, n_tok = got["stats"], sum(map(len, got["tokens"]))
            ent = update["policy_entropy"]  # vLLM returns no entropies: the trainer's recomputation stands in
            if got["entropies"] is not None:
                ent = sum(sum(e) for e in got["entropies"]) / max(n_tok, 1)
            row = {"step": step + 1, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
                   "entropy_mean": ent, "acceptance_rate": stats["acceptance_rate"],
                   "mean_acceptance_length": stats["mean_acceptance_length"],
                   "per_position_acceptance": stats["per_position_acceptance"],
                   "mean_draft_len": stats["mean_draft_len"], "tokens": n_tok,
                   "completion_length_mean": n_tok / len(samples), "rollout_s": got["rollout_s"],
                   "reward_s": reward_s, "train_s": train_s, "mtp_train_s": mtp_train_s, "sync_s": sync_s, **sync,
                   "wait_s": wait_s if one_step else None, "step_s": step_s,
                   "worker_restarts": getattr(worker, "restarts", 0) - restarts,
                   "dispatch_s": got.get("dispatch_s"),  # Ray: the batch's wall time beyond its slowest worker's
                   "policy_version": step, "rollout_policy_version": got["version"],
                   "policy_version_lag": step - got["version"], **update, **mtp_update}
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                row.update({k: v for k, v in evaluate(step + 1).items() if k != "step"})
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                save_checkpoint(out, step + 1, policy, mtp if online else None, opt, mtp_opt, pending)
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:.2f}",
                            acc="-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}")
        bar.close()
    finally:
        worker.close()
    return rows
