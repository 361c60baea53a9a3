"""TRL GRPO on smollm2-135m with bebop rollouts, rewarded by bebop's built-in arithmetic tasks.

    OMP_NUM_THREADS=1 python examples/trl_grpo.py --backends trl,ar,spec --steps 3 --prompts 4 --generations 4 \
        --max-new-tokens 64 --json runs/trl-grpo.json

Each backend trains a fresh copy of the model for the same steps on the same prompts with the same seed:
`trl` is TRL's own generation (transformers `generate`), `ar` and `spec` are `BebopRollout` with plain and
speculative sampling. Backends run one after another in this process, `--repeats` times interleaved, so their
timings share the machine's conditions. TRL prints its own log line per step (bebop's statistics and timings
included, under `bebop/`); `rollout_time` is the wall time of TRL's `_generate` (templating, generation,
decoding, and for bebop the weight sync), the same measurement for every backend.
Needs `pip install 'bebop-rl[trl]'`.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bebop.errors import BebopError  # noqa: E402
from bebop.integrations.trl import BebopRollout  # noqa: E402
from bebop.models.registry import load_hf  # noqa: E402
from bebop.tasks import rl_tasks  # noqa: E402

BACKENDS = ("trl", "ar", "spec", "spec-greedy")


def task_reward(task, completion: str) -> float:
    """The one place that knows how a task scores a completion (1 for the right final answer)."""
    return task.reward(completion)


def arithmetic_reward(tasks):
    def reward(completions, task_index, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # conversational or not
        return [task_reward(tasks[i], text) for i, text in zip(task_index, texts)]
    reward.__name__ = "arithmetic"  # TRL logs rewards/<name>/mean
    return reward


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that also logs the wall time of its rollout phase (TRL's profiling only reaches wandb/trackio)."""

    def _generate(self, prompts):
        start = time.perf_counter()
        out = super()._generate(prompts)
        self._metrics["train" if self.model.training else "eval"]["rollout_time"].append(time.perf_counter() - start)
        return out


def run(backend: str, args, tasks) -> list[dict]:
    hf, tok = load_hf(args.model)  # a fresh copy per run: training changes it
    rollout = None
    if backend != "trl":
        rollout = BebopRollout(args.model, mode=backend, draft_len=args.draft_len, dtype=args.dtype, draft=args.draft,
                               max_batch=args.max_batch, progress=True)
    config = GRPOConfig(
        output_dir=str(Path(args.output_dir) / backend), max_steps=args.steps, seed=args.seed,
        per_device_train_batch_size=args.prompts * args.generations, num_generations=args.generations,
        max_completion_length=args.max_new_tokens, temperature=args.temperature, learning_rate=args.lr,
        bf16=args.bf16, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_index": i}
                              for i, t in enumerate(tasks)])
    trainer = TimedGRPOTrainer(model=hf, reward_funcs=arithmetic_reward(tasks), args=config, train_dataset=data,
                               processing_class=tok, rollout_func=rollout)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "step_time" in h]
    for h in steps:  # samples differ between backends, and so do their lengths: compare rates too
        tokens = h["completions/mean_length"] * config.per_device_train_batch_size
        h["rollout_tokens_per_s"] = tokens / h["rollout_time"]
    return steps


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="trl,ar,spec", help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (GRPO group size)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--draft-len", type=lambda x: x if x == "auto" else int(x), default="auto")
    p.add_argument("--draft", "--mtp", default=None, help="draft for bebop spec: a checkpoint or EAGLE-3 directory (default: the shipped one)")
    p.add_argument("--dtype", default=None, help="bebop's rollout dtype (default: auto, bfloat16 where faster)")
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--bf16", action="store_true", help="TRL's bf16 autocast for training (default: fp32)")
    p.add_argument("--repeats", type=int, default=1, help="rounds over all backends, interleaved")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="runs/trl-grpo")
    p.add_argument("--json", default=None, help="write every step's TRL log and the summary here")
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    if unknown := set(backends) - set(BACKENDS):
        p.error(f"unknown backend(s) {', '.join(sorted(unknown))} (choose from {', '.join(BACKENDS)})")
    for name in ("steps", "prompts", "generations", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.generations < 2:
        p.error("--generations must be >= 2 (GRPO compares completions within a group)")

    tasks = rl_tasks("arithmetic", args.prompts * args.steps, seed=args.seed)  # calibrated default difficulty
    logs = {b: [] for b in backends}
    for r in range(args.repeats):
        for b in backends:
            print(f"== round {r + 1}/{args.repeats}: backend {b}", flush=True)
            logs[b] += run(b, args, tasks)

    keys = ("rollout_time", "rollout_tokens_per_s", "step_time", "bebop/generation_time", "bebop/weight_sync_time",
            "bebop/acceptance_rate", "bebop/mean_acceptance_length", "rewards/arithmetic/mean")
    summary = {b: {k: mean([h.get(k) for h in logs[b]]) for k in keys} for b in backends}
    print(f"\nmean per step over {args.repeats} x {args.steps} steps, {args.prompts} prompts x {args.generations} "
          f"generations, {args.max_new_tokens} new tokens, T={args.temperature}")
    names = [k.removeprefix("bebop/").removeprefix("rewards/") for k in keys]
    print(f"{'backend':<12}" + "".join(f"{k:>{max(12, len(k) + 2)}}" for k in names))
    for b in backends:
        print(f"{b:<12}" + "".join(f"{'-' if v is None else f'{v:.4g}':>{max(12, len(k) + 2)}}"
                                   for k, v in zip(names, summary[b].values())))
    if "trl" in summary:
        for b in backends:
            if b != "trl" and summary[b]["rollout_time"]:
                t, o = summary["trl"], summary[b]
                print(f"{b} vs trl: rollout time {t['rollout_time'] / o['rollout_time']:.2f}x faster, rollout tokens/s "
                      f"{o['rollout_tokens_per_s'] / t['rollout_tokens_per_s']:.2f}x, "
                      f"step time {t['step_time'] / o['step_time']:.2f}x faster")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "logs": logs}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except BebopError as e:
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)
