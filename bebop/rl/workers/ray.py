"""Rollout workers as Ray actors (`bebop rl --ray [ADDRESS] --rollout-workers N`), as verl and OpenRLHF place
theirs: N actors of either backend (bebop's worker or vLLM's) in one placement group, one bundle of
`threads` CPUs each; the trainer stays in the driver. `RayWorkers` is a RolloutWorker (bebop.rl.workers.base),
so the RL loop, its async modes and its staleness accounting do not change.

  weights   one `ray.put` per sync (the policy, and the draft when it trains, in the rollout dtype); every
            actor reads that one object from the object store.
  batches   the rows of a batch split into N contiguous shards, each with the seeds its rows have in the whole
            batch (row b of a batch with seed s draws from s * 1_000_003 + b), gathered in shard order: a run's
            samples do not depend on N or on which actor finished first.
  faults    an actor that dies is restarted by Ray (`max_restarts`), gets the last weights again and its shard
            re-issued; the step completes and counts `worker_restarts`.
Nothing here is imported without `--ray`.
"""

import os
import socket
import time

import torch

from bebop.engine.memory import retain_freed_memory
from bebop.engine.stats import SpecStats
from bebop.seeds import row_seeds
from bebop.errors import BebopError
from bebop.models import DTYPES
from bebop.rl.workers.local import in_process_worker

MAX_RESTARTS = 3  # per actor, over the run
RESTART_TIMEOUT_S = 120


class RolloutActor:
    """One rollout worker of either backend inside a Ray actor, with its own thread budget."""

    def __init__(self, spec, dtype, rollout, draft_len, max_draft_len, temperature, threads, vllm_args):
        torch.set_num_threads(threads)
        retain_freed_memory()
        self.worker = in_process_worker(spec, dtype, rollout, draft_len, max_draft_len, temperature, threads, vllm_args)

    def load_weights(self, weights: dict, version: int) -> None:
        self.worker.load_weights(weights["policy"], weights["mtp"], version)

    def generate(self, prompts, max_new_tokens, seeds, learn=True) -> dict:
        self.worker.submit(prompts, max_new_tokens, seeds, learn)
        return self.worker.reply()

    def probe(self, ids) -> dict:
        return self.worker.probe(ids)

    def draft_state(self) -> dict | None:
        return self.worker.draft_state()

    def pid(self) -> int:
        return os.getpid()


def connect(address: str | None, cpus: int):
    """(ray, whether this call started it): join the cluster at `address` ('auto': the running one), or start a
    local one with `cpus` CPUs (or use the one this process already joined)."""
    try:
        import ray
    except ImportError:
        raise BebopError("--ray needs Ray: pip install 'bebop-rl[ray]'") from None
    if address not in (None, "auto"):  # Ray waits minutes for an address nobody answers at: ask first
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise BebopError(f"cannot reach Ray at '{address}': {type(e).__name__}: {e}") from None
    if ray.is_initialized():
        return ray, False
    try:
        if address is None:
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as e:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError, ValueError...
        raise BebopError(f"cannot reach Ray at '{address or 'local'}': {type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0]}") from None
    return ray, True


def merge_stats(parts: list[dict]) -> dict:
    """One batch's statistics from its shards' (sums of counts; ratios re-formed from them)."""
    return SpecStats.total(SpecStats.from_summary(p) for p in parts).summary()


class RayWorkers:
    """N RolloutActors behind the RolloutWorker interface: a batch split into shards, one per actor."""

    def __init__(self, spec: dict, cfg, dtype: str, threads: int, vllm_args: dict | None = None):
        ray, self.started = connect(cfg.ray if cfg.ray != "local" else None, cfg.total_threads())
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.dtype, self.n = ray, DTYPES[dtype], cfg.rollout_workers
        need, have = self.n * threads, int(ray.cluster_resources().get("CPU", 0))
        if need > have:
            raise BebopError(f"--rollout-workers {self.n} x {threads} threads needs {need} CPUs; the Ray cluster has {have}")
        self.group = placement_group([{"CPU": threads}] * self.n, strategy="PACK")
        self._remove_group = remove_placement_group
        ready, _ = ray.wait([self.group.ready()], timeout=120)
        if not ready:
            self.close()
            raise BebopError(f"Ray could not place {self.n} rollout workers of {threads} CPUs within 120 s")
        actor = ray.remote(num_cpus=threads, max_restarts=MAX_RESTARTS, max_task_retries=0)(RolloutActor)
        self.actors = []
        for i in range(self.n):
            args = None if vllm_args is None else {k: v for k, v in vllm_args.items() if k != "log"} | {"first_core": i * threads}
            where = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
            self.actors.append(actor.options(scheduling_strategy=where).remote(
                spec, dtype, cfg.rollout, cfg.draft_len, cfg.max_draft_len, cfg.temperature, threads, args))
        self.weights, self.restarts, self.pending = None, 0, None
        self._call_all("pid")  # every actor up (a failing start is one error line here)

    def _get(self, i: int, method: str, *args, future=None):
        """actor i's `method(*args)` (or the answer to `future`, a call already made). An actor that dies is
        restarted by Ray: it gets the last weights again and the same call, and the death is counted."""
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        future = future if future is not None else getattr(self.actors[i], method).remote(*args)
        deadline = None
        while True:
            try:
                return self.ray.get(future)
            except RayTaskError as e:  # the worker raised: its message, one line
                cause = e.cause if isinstance(e.cause, Exception) else e
                raise BebopError(f"rollout worker {i} failed: {type(cause).__name__}: "
                                 f"{(str(cause).splitlines() or [''])[0]}") from None
            except (RayActorError, ActorUnavailableError):  # died, or still restarting
                if deadline is None:
                    deadline = time.monotonic() + RESTART_TIMEOUT_S
                    self.restarts += 1
                if time.monotonic() > deadline:
                    raise BebopError(f"rollout worker {i} died and did not come back within {RESTART_TIMEOUT_S} s "
                                     f"(Ray restarts an actor at most {MAX_RESTARTS} times)") from None
                time.sleep(0.5)
                if self.weights is not None and method != "load_weights":  # a restarted actor starts empty
                    future = self.actors[i].load_weights.remote(*self.weights)
                    try:
                        self.ray.get(future)
                    except (RayActorError, ActorUnavailableError):
                        continue
                future = getattr(self.actors[i], method).remote(*args)

    def _call_all(self, method: str, *args) -> list:
        """`method(*args)` on every actor at once; the answers in actor order."""
        futures = [getattr(actor, method).remote(*args) for actor in self.actors]
        return [self._get(i, method, *args, future=f) for i, f in enumerate(futures)]

    def load_weights(self, policy: dict, mtp: dict, version: int) -> None:
        weights = {"policy": {k: v.detach().to(self.dtype) for k, v in policy.items()},
                   "mtp": {k: v.detach().to(self.dtype) for k, v in mtp.items()}}
        if self.weights is not None and not mtp:  # a frozen draft: a restarted actor needs the one sent last
            weights["mtp"] = self.last_mtp
        else:
            self.last_mtp = weights["mtp"]
        self.weights = (self.ray.put(weights), version)  # one object for every actor
        self._call_all("load_weights", *self.weights)

    def submit(self, prompts: list[list[int]], max_new_tokens: int, seed: int, learn: bool = True) -> None:
        seeds = row_seeds(seed, len(prompts))
        cuts = [len(prompts) * i // self.n for i in range(self.n + 1)]
        self.pending = (time.perf_counter(), [(prompts[a:b], max_new_tokens, seeds[a:b], learn)
                                              for a, b in zip(cuts, cuts[1:])])
        self.futures = [(i, a.generate.remote(*shard)) for i, (a, shard) in enumerate(zip(self.actors, self.pending[1]))
                        if shard[0]]

    def reply(self) -> dict:
        start, shards = self.pending
        parts = [self._get(i, "generate", *shards[i], future=future) for i, future in self.futures]
        joined = lambda key: None if any(p[key] is None for p in parts) else [x for p in parts for x in p[key]]
        wall = time.perf_counter() - start
        return {"tokens": joined("tokens"), "logprobs": joined("logprobs"), "entropies": joined("entropies"),
                "stats": merge_stats([p["stats"] for p in parts]), "version": min(p["version"] for p in parts),
                "rollout_s": wall, "dispatch_s": wall - max(p["rollout_s"] for p in parts)}  # Ray's share

    def probe(self, ids: list[int]) -> list[dict]:
        return self._call_all("probe", ids)

    def draft_state(self) -> dict | None:
        """The first actor's (a history draft runs on one actor: RLConfig.validate)."""
        return self._get(0, "draft_state")

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            self.ray.kill(actor, no_restart=True)
        self._remove_group(self.group)
        if self.started:
            self.ray.shutdown()
