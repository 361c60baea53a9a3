"""Rollout workers as Ray actors (bebop.rl.workers.ray) on a local Ray instance with 2 CPUs, tiny-llama in fp32:
two workers give the local pipeline's samples and metrics schema, a worker killed mid-batch is restarted and the
batch completes with the same samples, bad input is one line."""

import importlib.util

import pytest
import torch

from bebop.errors import BebopError
from bebop.models.registry import chat_ids, load_model
from bebop.drafts.mtp import new_mtp
from bebop.rl.config import RLConfig
from bebop.rl.loop import run_rl
from bebop.rl.sync import model_spec, mtp_state, policy_state

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="Ray is not installed here (make test installs bebop[ray])"),
              pytest.mark.timeout(600)]
PROMPTS = ["add 2 and 3", "name a fruit", "say hi", "count to 4", "spell cat", "pick a colour"]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


class ToyTask:
    def __init__(self, prompt):
        self.prompt = prompt

    def reward(self, completion: str) -> float:
        return sum(c.isalpha() for c in completion) / max(len(completion), 1)


def config(**kw):
    base = dict(model="tiny-llama", steps=2, prompts_per_step=3, num_generations=2, max_completion_length=10,
                learning_rate=1e-3, micro_batch_size=3, autocast="off", rollout="spec", draft_len=2, eval_prompts=2,
                threads=2, rollout_dtype="float32")
    return RLConfig(**{**base, **kw})


def run(cfg, out):
    policy, tok = load_model(cfg.model, dtype="float32")
    tasks = [ToyTask(p) for p in PROMPTS]
    return run_rl(cfg, out, policy, tok, tasks, tasks[:2], new_mtp(policy, seed=1), progress=False)


def test_two_ray_workers_give_the_local_pipelines_samples_and_schema(ray_local, tmp_path):
    local = run(config(), tmp_path / "local")
    on_ray = run(config(ray="local", rollout_workers=2), tmp_path / "ray")
    assert set(on_ray[0]) == set(local[0])
    for a, b in zip(local, on_ray):  # each row's seed is its place in the batch, whichever worker drew it
        assert (a["tokens"], a["reward_mean"], a["acceptance_rate"]) == (b["tokens"], b["reward_mean"], b["acceptance_rate"])
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert b["worker_restarts"] == 0 and b["sync_probe_error"] < 1e-4


def test_a_worker_killed_mid_batch_is_restarted_and_the_batch_completes(ray_local, perturbed):
    from bebop.rl.workers.ray import RayWorkers

    policy, tok = load_model("tiny-llama", dtype="float32")
    mtp = new_mtp(policy, seed=1)
    cfg = config(ray="local", rollout_workers=2)
    workers = RayWorkers(model_spec(policy, mtp, "float32"), cfg, "float32", 1)
    try:
        workers.load_weights(policy_state(policy), mtp_state(mtp), 0)
        prompts = [chat_ids(tok, p) for p in PROMPTS for _ in range(2)]
        workers.submit(prompts, 24, 7)
        clean = workers.reply()
        workers.submit(prompts, 24, 7)
        ray_local.kill(workers.actors[0], no_restart=False)  # Ray restarts it; its shard is asked again
        got = workers.reply()
        assert workers.restarts == 1
        flat = lambda rows: [x for row in rows for x in row]
        assert got["tokens"] == clean["tokens"] and flat(got["logprobs"]) == pytest.approx(flat(clean["logprobs"]))
        assert got["stats"]["tokens"] == sum(map(len, got["tokens"]))
        # the restarted actor holds the trainer's weights (the sync check passes), a stale copy fails it
        from bebop.rl.sync import check_sync

        probe = prompts[0]
        assert check_sync(workers, policy, probe, "float32", float("inf"))["sync_probe_error"] < 1e-4
        with pytest.raises(BebopError, match="not the trainer's"):
            check_sync(workers, perturbed(policy), probe, "float32", float("inf"))
    finally:
        workers.close()


@pytest.mark.parametrize("argv, message", [
    (["--rollout-workers", "2"], "--rollout-workers above 1 needs --ray"),
    (["--ray", "--rollout-workers", "3"], "needs 3 CPUs; the Ray cluster has 2"),
])
def test_rl_cli_ray_bad_input_is_one_line(ray_local, tmp_path, capsys, argv, message):
    from bebop.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["rl", "--model", "tiny-llama", "--steps", "1", "--threads", "2", "--draft", "random", *argv, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and err.startswith("bebop: error:") and message in err, err


def test_an_unreachable_ray_address_is_one_line_in_seconds():
    from bebop.rl.workers.ray import connect

    with pytest.raises(BebopError, match="cannot reach Ray at '127.0.0.1:9'"):
        connect("127.0.0.1:9", 2)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make test installs it)")
def test_two_ray_workers_with_vllm_each_on_its_core(ray_local, vllm_model_dir, tmp_path):
    """The vLLM backend under Ray: each actor runs its own vLLM on its bundle's core; same metrics as without."""
    from bebop.drafts.eagle3 import new_eagle3

    policy, tok = load_model(vllm_model_dir, dtype="float32")
    tasks = [ToyTask(p) for p in PROMPTS]
    cfg = config(model=vllm_model_dir, rollout_backend="vllm", ray="local", rollout_workers=2, steps=1)
    rows = run_rl(cfg, tmp_path / "r", policy, tok, tasks, tasks[:2], new_eagle3(policy, seed=1), progress=False)
    assert rows[0]["sync_probe_error"] < 1e-3 and rows[0]["sync_draft_error"] < 1e-3
    assert rows[0]["acceptance_rate"] is not None and rows[0]["worker_restarts"] == 0
