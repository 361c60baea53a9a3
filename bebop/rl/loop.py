"""The RL loop: rollouts -> rewards -> GRPO update -> (online MTP update) -> weight sync, synchronous or
one step off-policy. The rollout side is a RolloutWorker (bebop.rl.workers), the weight sync and its check
bebop.rl.sync, the updates bebop.rl.trainer.

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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from bebop import io as checkpoint
from bebop.backends.vllm.worker import DRAFT_CHECK_TOL, vllm_args
from bebop.drafts.base import Draft
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft, history_of
from bebop.errors import BebopError
from bebop.models import DTYPES  # noqa: F401 -- old name (bebop.rl.loop.DTYPES), kept for one release
from bebop.models import cpu, devices
from bebop.models.decoder import Decoder
from bebop.models.registry import cache_dir, chat_ids, probed_choice, probed_compiled, probed_kernels
from bebop.rl import grpo
from bebop.rl.config import RLConfig, with_current_names
from bebop.rl.sync import check_sync, mtp_state, policy_state
from bebop.rl.trainer import MTP_LOSS, Sample, autocast_choice, mtp_step, policy_step
from bebop.rl.workers import RolloutWorker, make_workers
from bebop.seeds import batch_seed

# old names, kept for one release
from bebop.rl.sync import SYNC_GAP_FACTOR, SYNC_PROBE_TOL, model_spec, token_logprobs  # noqa: F401
from bebop.rl.trainer import probe_bf16  # noqa: F401
from bebop.rl.workers.local import LocalWorker
from bebop.rl.workers.process import WorkerProcess, worker_main  # noqa: F401


@dataclass
class Learner:
    """The trainer side of a run: the policy (fp32, trained in place), its optimiser, the frozen reference
    (beta > 0), and the rollouts' draft with its optimiser when an online strategy trains it."""
    policy: Decoder
    opt: torch.optim.Optimizer
    ref: Decoder | None
    mtp: Draft | HistoryDraft | HybridDraft | None  # None for autoregressive rollouts
    mtp_opt: torch.optim.Optimizer | None  # None unless the MTP trains online
    use_bf16: bool = False  # training forwards under bf16 autocast

    @property
    def online(self) -> bool:
        return self.mtp_opt is not None

    @property
    def trained_mtp(self) -> Draft | None:
        """The MTP when it trains (its weights sync and checkpoint with the policy's), else None."""
        return self.mtp if self.online else None


@dataclass
class Rollouts:
    """The rollout side as the loop drives it: the worker(s), the rollout dtype, and what batches are asked for
    and scored on."""
    worker: RolloutWorker | None
    dtype: str
    tokenizer: object
    score: Callable[[list, list[str]], list[float]]
    train_tasks: list
    train_ids: list[list[int]]  # each train task's prompt, as token ids
    eval_tasks: list
    eval_ids: list[list[int]]
    draft_tol: float = float("inf")  # the sync check's tolerance on the worker's draft (vLLM's; bebop's are copies)

    @property
    def probe_ids(self) -> list[int]:
        """A fixed sequence the sync check scores on both sides."""
        return self.eval_ids[0] + self.train_ids[0]


# ----- data order -----

def step_prompts(pool: list, prompt_ids: list[list[int]], cfg: RLConfig, step: int):
    """Batch `step`: prompts_per_step tasks in the run's fixed order, each repeated num_generations times."""
    idx = [(step * cfg.prompts_per_step + i) % len(pool) for i in range(cfg.prompts_per_step)]
    tasks = [pool[i] for i in idx for _ in range(cfg.num_generations)]
    return tasks, [prompt_ids[i] for i in idx for _ in range(cfg.num_generations)]


# ----- checkpoints: everything into a fresh directory, then one os.replace of the pointer file -----

def save_checkpoint(out: Path, step: int, policy, mtp, opt, mtp_opt, pending, history: dict | None = None) -> None:
    """Policy (+ the MTP when it trains), optimisers, RNG, the in-flight one-step batch and a history draft's
    state (the worker's, RolloutWorker.draft_state), committed together (bebop.io: one directory rename is the
    commit point)."""
    tensors = {f"policy.{k}": v for k, v in policy_state(policy).items()}
    if mtp is not None:
        tensors.update({f"mtp.{k}": v for k, v in mtp.state_dict().items()})
    state = {"optimizer": opt.state_dict(), "mtp_optimizer": mtp_opt and mtp_opt.state_dict(),
             "torch_rng": torch.get_rng_state(), "pending": pending, "history": history}
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


# ----- the run: prepare, build, loop, record -----

def run_rl(cfg: RLConfig, out, policy: Decoder, tokenizer, train_tasks: list, eval_tasks: list,
           mtp: Draft | HistoryDraft | None, score=None, resume: bool = False, progress: bool = True) -> list[dict]:
    """Train `policy` (fp32, in place) with GRPO for cfg.steps steps; write DIR/metrics.jsonl, DIR/eval.jsonl,
    DIR/config.json and checkpoints. `score(tasks, texts) -> list[float]` rewards completions (default: each
    task's own reward). Returns the metric rows of the steps run."""
    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    score = score or (lambda tasks, texts: [t.reward(c) for t, c in zip(tasks, texts)])
    prepare_run_dir(cfg, out, resume)
    train_threads, rollout_threads = thread_split(cfg)
    torch.set_num_threads(train_threads)
    torch.manual_seed(cfg.seed)
    learner = build_learner(cfg, policy, mtp)
    learner.use_bf16, rollout_dtype = record_run(cfg, out, policy, resume, train_threads, rollout_threads)
    side = Rollouts(None, rollout_dtype, tokenizer, score, train_tasks, [chat_ids(tokenizer, t.prompt) for t in
                    train_tasks], eval_tasks, [chat_ids(tokenizer, t.prompt) for t in eval_tasks])
    start, pending = 0, None
    if resume:
        state = load_checkpoint(out, policy, learner.trained_mtp, learner.opt, learner.mtp_opt)
        start, pending = state["step"], state["pending"]
        if history_of(learner.mtp) is not None and state.get("history") is not None:  # drafts as the
            history = HistoryDraft.from_state(state["history"])  # uninterrupted run would
            learner.mtp = HybridDraft(learner.mtp.model, history) if isinstance(learner.mtp, HybridDraft) else history
        for name in ("metrics.jsonl", "eval.jsonl"):  # drop rows logged after the checkpoint: they are redone
            checkpoint.truncate_log(out / name, start)
    side.worker, side.draft_tol = start_workers(cfg, out, learner, side, rollout_threads)
    try:
        side.worker.load_weights(policy_state(policy), mtp_state(learner.mtp), start)
        check_sync(side.worker, policy, side.probe_ids, rollout_dtype, side.draft_tol)
        if start == 0:
            evaluate(cfg, out, side, 0)
        return run_steps(cfg, out, learner, side, start, pending, progress)
    finally:
        side.worker.close()


def prepare_run_dir(cfg: RLConfig, out: Path, resume: bool) -> None:
    """Refuse to resume without a checkpoint or with other settings, and to start over a run; clear a fresh run's
    logs; write config.json."""
    config = asdict(cfg)
    has_checkpoint = bool(checkpoint.committed(out / "ckpt"))
    if resume and has_checkpoint:
        saved = with_current_names(json.loads((out / "config.json").read_text()))
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


def thread_split(cfg: RLConfig) -> tuple[int, int]:
    """(trainer threads, rollout threads): one-step off-policy splits the budget, else each phase has it all."""
    total = cfg.total_threads()
    if cfg.async_mode == "one-step":
        return total - total // 2, total // 2
    return total, total


def build_learner(cfg: RLConfig, policy: Decoder, mtp: Draft | HistoryDraft | None) -> Learner:
    """The policy's optimiser and reference; the draft dropped for autoregressive rollouts, given an optimiser
    when an online strategy trains it."""
    policy.requires_grad_(True).eval()
    ref = copy.deepcopy(policy).requires_grad_(False) if cfg.beta > 0 else None
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    online = cfg.rollout != "ar" and cfg.draft_strategy in MTP_LOSS
    if cfg.rollout == "ar":
        mtp = None
    mtp_opt = None
    if online:
        mtp.requires_grad_(True)
        mtp_opt = torch.optim.AdamW([p for p in mtp.parameters() if p.requires_grad], lr=cfg.draft_learning_rate)
    return Learner(policy, opt, ref, mtp, mtp_opt)


def choose_numerics(cfg: RLConfig, out: Path, policy: Decoder, resume: bool) -> tuple[bool, dict | str | None, str]:
    """(train under bf16 autocast?, that probe's timings or verdict, the rollout dtype). A resumed run keeps the
    verdicts it started with: they are part of the run."""
    if resume:
        saved = json.loads((out / "run.json").read_text())
        return saved["use_bf16"], "resumed", saved.get("rollout_dtype", "bfloat16")  # (older runs rolled out in bf16)
    if cfg.autocast == "auto":
        use_bf16, probe = autocast_choice(policy, cfg.micro_batch_size, 64, cache_dir())
    else:
        use_bf16, probe = cfg.autocast == "bf16", None
    rollout_dtype = cfg.rollout_dtype
    if rollout_dtype == "auto":  # what --dtype auto would run the model in (probed once per CPU; bf16 on a GPU)
        choice = probed_choice(policy, policy.name)
        rollout_dtype = choice["dtype"] if choice else "float32"
    return use_bf16, probe, rollout_dtype


def record_run(cfg: RLConfig, out: Path, policy: Decoder, resume: bool, train_threads: int,
               rollout_threads: int) -> tuple[bool, str]:
    """Write run.json (the numerics chosen, the rollout kernels, the threads, the machine); returns
    (use_bf16, rollout dtype)."""
    use_bf16, probe, rollout_dtype = choose_numerics(cfg, out, policy, resume)
    attention, linear = probed_kernels(policy, rollout_dtype)
    meta = {"use_bf16": use_bf16, "probe": probe, "rollout_dtype": rollout_dtype, "rollout_attention": list(attention),
            "rollout_linear": linear, "rollout_compiled": probed_compiled(policy, rollout_dtype),
            "train_threads": train_threads, "rollout_threads": rollout_threads,
            "rollout_workers": cfg.rollout_workers, "ray": cfg.ray,
            "device": devices.describe(policy.embed.weight.device), "cpu": cpu.cpu_model(),
            "cpu_capability": cpu.describe(), "torch": torch.__version__}
    (out / "run.json").write_text(json.dumps(meta, indent=1))
    return use_bf16, rollout_dtype


def start_workers(cfg: RLConfig, out: Path, learner: Learner, side: Rollouts, threads: int) -> tuple:
    """The rollout worker(s) (bebop.rl.workers.make_workers) and the tolerance of the sync check on their draft:
    vLLM's draft is checked, bebop's worker holds exact copies."""
    draft_tol, engine_args = float("inf"), None
    if cfg.rollout_backend == "vllm":
        draft_tol = DRAFT_CHECK_TOL
        longest = max(map(len, side.train_ids + side.eval_ids + [side.probe_ids])) + cfg.max_completion_length
        engine_args = vllm_args(cfg, learner.mtp, out, longest)
    return make_workers(cfg, learner.policy, learner.mtp, side.dtype, threads, engine_args), draft_tol


def submit_batch(cfg: RLConfig, side: Rollouts, step: int) -> None:
    """Ask the rollout side for batch `step` (its prompts and seed depend on the step alone)."""
    side.worker.submit(step_prompts(side.train_tasks, side.train_ids, cfg, step)[1], cfg.max_completion_length,
                       batch_seed(cfg.seed, step))


def run_steps(cfg: RLConfig, out: Path, learner: Learner, side: Rollouts, start: int, pending: dict | None,
              progress: bool) -> list[dict]:
    """Steps start..cfg.steps: a batch of rollouts, the updates, the weight sync and its check, the metrics row
    (and eval rows, checkpoints). One-step off-policy trains on the batch generated during the previous step
    (`pending`). Returns the steps' metric rows."""
    one_step, carry_s, rows = cfg.async_mode == "one-step", 0.0, []
    if one_step and pending is None and start < cfg.steps:  # the first batch has nothing to overlap with
        t0 = time.perf_counter()
        submit_batch(cfg, side, start)
        pending = side.worker.reply()
        carry_s = time.perf_counter() - t0
    bar = tqdm(total=cfg.steps, initial=start, desc=f"rl {cfg.rollout} {cfg.async_mode}", disable=not progress)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        restarts = getattr(side.worker, "restarts", 0)  # (Ray's actors: restarted after dying)
        tasks, prompts = step_prompts(side.train_tasks, side.train_ids, cfg, step)
        wait_s = None
        if one_step:
            got, wait_s = pending, 0.0
            if step + 1 < cfg.steps:  # batch n+1 with weights n, while batch n trains below
                submit_batch(cfg, side, step + 1)
        else:
            submit_batch(cfg, side, step)
            got = side.worker.reply()
        rewards, samples, times, update = learn(cfg, learner, side, tasks, prompts, got)
        if one_step and step + 1 < cfg.steps:
            t_wait = time.perf_counter()
            pending = side.worker.reply()
            wait_s = time.perf_counter() - t_wait
        elif one_step:
            pending = None
        times.update(sync_weights(learner, side, step + 1))
        times.update(wait_s=wait_s, step_s=time.perf_counter() - t0 + carry_s,
                     worker_restarts=getattr(side.worker, "restarts", 0) - restarts)
        carry_s = 0.0
        row = metrics_row(step, rewards, samples, got, times, update)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            row.update({k: v for k, v in evaluate(cfg, out, side, step + 1).items() if k != "step"})
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, step + 1, learner.policy, learner.trained_mtp, learner.opt, learner.mtp_opt, pending,
                            side.worker.draft_state() if history_of(learner.mtp) is not None else None)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:.2f}",
                        acc="-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}")
    bar.close()
    return rows


def learn(cfg: RLConfig, learner: Learner, side: Rollouts, tasks: list, prompts: list[list[int]], got: dict):
    """Score the batch `got`, then one GRPO update of the policy (and one of the MTP when it trains online).
    Returns the rewards [B], the samples, the timings {reward_s, train_s, mtp_train_s} and the updates' metrics."""
    t_reward = time.perf_counter()
    texts = [side.tokenizer.decode(t, skip_special_tokens=True) for t in got["tokens"]]
    rewards = torch.tensor(side.score(tasks, texts), dtype=torch.float32)
    adv = grpo.advantages(rewards, cfg.num_generations, cfg.scale_rewards)
    samples = [Sample(p, t, lp, float(a)) for p, t, lp, a in zip(prompts, got["tokens"], got["logprobs"], adv)]
    reward_s = time.perf_counter() - t_reward
    t_train = time.perf_counter()
    update = policy_step(learner.policy, learner.opt, samples, cfg, learner.use_bf16, learner.ref)
    train_s = time.perf_counter() - t_train
    mtp_train_s, mtp_update = 0.0, {}
    if learner.online:
        mtp = learner.mtp
        t_mtp = time.perf_counter()
        mtp_update = mtp_step(mtp, learner.mtp_opt, learner.policy, samples, cfg, learner.use_bf16)
        mtp.set_draft_vocab(mtp.vocab_ids if len(mtp.vocab_ids) else None)  # the head moved with the policy
        mtp_train_s = time.perf_counter() - t_mtp
    return rewards, samples, {"reward_s": reward_s, "train_s": train_s, "mtp_train_s": mtp_train_s}, \
        {**update, **mtp_update}


def sync_weights(learner: Learner, side: Rollouts, version: int) -> dict:
    """The trainer's weights (version `version`) to the rollout side, then the check that it took them:
    {sync_s, the check's figures (bebop.rl.sync.check_sync), sync_check_s}."""
    t_sync = time.perf_counter()
    side.worker.load_weights(policy_state(learner.policy), mtp_state(learner.mtp) if learner.online else {}, version)
    sync_s = time.perf_counter() - t_sync
    t_check = time.perf_counter()
    sync = check_sync(side.worker, learner.policy, side.probe_ids, side.dtype, side.draft_tol)
    return {"sync_s": sync_s, **sync, "sync_check_s": time.perf_counter() - t_check}


def metrics_row(step: int, rewards: torch.Tensor, samples: list[Sample], got: dict, times: dict, update: dict) -> dict:
    """metrics.jsonl's row for step `step` (numbered step + 1: the weights it produced)."""
    stats, n_tok = got["stats"], sum(map(len, got["tokens"]))
    ent = update["policy_entropy"]  # vLLM returns no entropies: the trainer's recomputation stands in
    if got["entropies"] is not None:
        ent = sum(sum(e) for e in got["entropies"]) / max(n_tok, 1)
    return {"step": step + 1, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "entropy_mean": ent, "acceptance_rate": stats["acceptance_rate"],
            "mean_acceptance_length": stats["mean_acceptance_length"],
            "per_position_acceptance": stats["per_position_acceptance"],
            "mean_draft_len": stats["mean_draft_len"], "drafted_tokens": stats.get("drafted"),
            "accepted_tokens": stats.get("accepted"), "history_drafted_tokens": stats.get("history_drafted"),
            "history_accepted_tokens": stats.get("history_accepted"), "tokens": n_tok,
            "completion_length_mean": n_tok / len(samples), "rollout_s": got["rollout_s"], **times,
            "dispatch_s": got.get("dispatch_s"),  # Ray: the batch's wall time beyond its slowest worker's
            "policy_version": step, "rollout_policy_version": got["version"],
            "policy_version_lag": step - got["version"], **update}


def evaluate(cfg: RLConfig, out: Path, side: Rollouts, step: int) -> dict:
    """The held-out reward of the weights the rollout side holds (the eval prompts, one fixed seed), appended to
    eval.jsonl."""
    t0 = time.perf_counter()
    side.worker.submit(side.eval_ids, cfg.max_completion_length, batch_seed(cfg.seed + 1, 0), learn=False)
    got = side.worker.reply()
    texts = [side.tokenizer.decode(t, skip_special_tokens=True) for t in got["tokens"]]
    r = side.score(side.eval_tasks, texts)
    row = {"step": step, "heldout_reward": sum(r) / len(r), "heldout_n": len(r),
           "heldout_ci95": wilson(sum(r), len(r)), "eval_s": time.perf_counter() - t0}
    with open(out / "eval.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def wilson(k: float, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval for a mean reward in [0, 1] over n samples."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


RolloutWorker = LocalWorker  # old name (the in-process worker), kept for one release
