"""A rollout worker in a spawned process (one-step off-policy, and vLLM): `WorkerProcess` on the trainer's side,
`worker_main` serving plain-data requests on the other. Weights travel through shared-memory tensors, written
by the trainer and copied in by the worker on 'load': no file round-trip, no pickling of weights per step."""

import os
import queue
import time
import traceback

import torch
import torch.multiprocessing as mp

from bebop.engine.memory import retain_freed_memory
from bebop.errors import BebopError
from bebop.models import DTYPES
from bebop.rl.sync import model_spec, mtp_state, policy_state
from bebop.rl.workers.local import in_process_worker

POLL_S = 5  # how often a side waiting on a queue checks that the other is still alive


def worker_main(spec, dtype, rollout, draft_len, max_draft_len, temperature, threads, shared_policy, shared_mtp,
                inbox, outbox, vllm_args=None):
    """The worker process: bebop's worker (or, with `vllm_args`, vLLM's, whose log goes to vllm_args["log"])
    serving plain-data requests until 'stop'."""
    torch.set_num_threads(threads)
    retain_freed_memory()  # a spawned process: malloc starts untuned here (bebop.engine.memory)
    try:
        if vllm_args is not None:
            log = os.open(vllm_args.pop("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)  # vLLM's log lines: into the run's vllm.log, not over the trainer's progress bar
            os.dup2(log, 2)
        worker = in_process_worker(spec, dtype, rollout, draft_len, max_draft_len, temperature, threads, vllm_args)
        outbox.put({"ready": True})
        trainer = os.getppid()
        while True:
            try:
                kind, arg = inbox.get(timeout=POLL_S)
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
            elif kind == "draft_state":
                outbox.put({"draft_state": worker.draft_state()})
            elif kind == "generate":
                worker.submit(**arg)
                outbox.put(worker.reply())
    except Exception as e:  # surface the worker's failure in the trainer instead of hanging it
        line = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        outbox.put({"error": traceback.format_exc(), "line": line, "bebop": isinstance(e, BebopError)})


class WorkerProcess:
    """A RolloutWorker (bebop.rl.workers.base) in a spawned process, on `threads` threads; with `vllm_args`
    (bebop.backends.vllm.worker.vllm_args) vLLM generates there."""

    def __init__(self, policy, mtp, cfg, dtype: str, threads: int, vllm_args: dict | None = None):
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
                msg = self.outbox.get(timeout=POLL_S)
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

    def submit(self, prompts, max_new_tokens, seed, learn: bool = True) -> None:
        self.inbox.put(("generate", {"prompts": prompts, "max_new_tokens": max_new_tokens, "seed": seed,
                                     "learn": learn}))

    def probe(self, ids: list[int]) -> dict:
        self.inbox.put(("probe", ids))
        return self.reply()

    def draft_state(self) -> dict | None:
        self.inbox.put(("draft_state", None))
        return self.reply()["draft_state"]

    def close(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(("stop", None))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
