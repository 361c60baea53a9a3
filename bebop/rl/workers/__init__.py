"""Rollout workers: the interface the RL loop drives (base), and where a run's workers live — this process
(local), a spawned process (process), or Ray actors (ray) — chosen by `make_workers`."""

from bebop.rl.sync import model_spec
from bebop.rl.workers.base import RolloutWorker
from bebop.rl.workers.local import LocalWorker
from bebop.rl.workers.process import WorkerProcess
from bebop.rl.workers.ray import RayWorkers


def make_workers(cfg, policy, mtp, dtype: str, threads: int, vllm_args: dict | None = None) -> RolloutWorker:
    """The run's rollout side in `dtype` on `threads` threads: Ray actors under --ray (the threads split between
    them), a spawned process for vLLM (`vllm_args`) or one-step off-policy, else this process."""
    if cfg.ray is not None:
        return RayWorkers(model_spec(policy, mtp, dtype), cfg, dtype, max(1, threads // cfg.rollout_workers), vllm_args)
    if cfg.rollout_backend == "vllm" or cfg.async_mode == "one-step":
        return WorkerProcess(policy, mtp, cfg, dtype, threads, vllm_args)
    return LocalWorker(model_spec(policy, mtp, dtype), dtype, cfg.rollout, cfg.draft_len, cfg.max_draft_len,
                       cfg.temperature)
