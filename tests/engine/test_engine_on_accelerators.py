"""The engine's guarantees on an accelerator (the `accelerator` fixture: CUDA where torch sees a GPU; skipped with
a reason elsewhere, or run on the CPU with BEBOP_TEST_DEVICES=cpu): the tokens of every mode are distributed as the
target's own, temperature 0 gives plain decoding's tokens, and a row's output does not depend on its batch. The
models are the sharpened tiny ones of test_generation.py, moved to the device."""

import copy

import numpy as np
import pytest

from bebop.drafts.eagle3 import new_eagle3
from bebop.engine.generation import generate
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from bebop.studies.exactness import goodness_of_fit as gof
from bebop.studies.exactness import two_sample
from generation_helpers import TEXTS, agreeable_mtp, exact_marginals, sharpened, token_matrix

P_OK = 1e-3
ROWS = 3000
T1 = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def on_device(tiny_llama, accelerator):
    """(sharpened tiny-llama on the device, an agreeable MTP there, prompt, exact marginals, ar tokens [ROWS, 3])."""
    model = sharpened(tiny_llama[0], 8.0).to(accelerator)
    mtp = agreeable_mtp(model)
    assert mtp.eh_proj.weight.device.type == accelerator.type  # a draft goes where its target is
    prompt = tiny_llama[1]("Hi!", add_special_tokens=False)["input_ids"]
    exact = exact_marginals(model, prompt, T1)
    ar = token_matrix(generate(model, [prompt] * ROWS, 3, T1, mode="ar", seed=11, eos_ids=[]))
    return model, mtp, prompt, exact, ar


@pytest.mark.parametrize("mode", ["ar", "spec", "spec-greedy"])
def test_every_mode_samples_the_target_distribution(on_device, mode):
    model, mtp, prompt, exact, ar = on_device
    gen = generate(model, [prompt] * ROWS, 3, T1, mode=mode, draft=mtp, draft_len=2, seed=12, eos_ids=[])
    if mode != "ar":
        assert 0.2 < gen.stats.acceptance_rate < 0.9  # both acceptance and rejection happen
    toks = token_matrix(gen)
    for j in range(3):
        assert gof(toks[:, j], exact[j]) > P_OK, f"{mode} token {j} vs exact"
        if mode != "ar":
            assert two_sample(toks[:, j], ar[:, j]) > P_OK, f"{mode} token {j} vs ar"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_temperature_zero_equals_ar(name, request, accelerator):
    model, tok = request.getfixturevalue(name.replace("-", "_"))
    model = copy.deepcopy(model).to(accelerator)
    prompts = [chat_ids(tok, t) for t in TEXTS]
    greedy = SamplingParams(temperature=0)
    ar = generate(model, prompts, 24, greedy, mode="ar", seed=0, eos_ids=[])
    for mtp in [agreeable_mtp(model, 1.0, 0.0), new_eagle3(model, 1)]:
        for mode in ["spec", "spec-greedy"]:
            gen = generate(model, prompts, 24, greedy, mode=mode, draft=mtp, draft_len=3, seed=5, eos_ids=[])
            for i, (a, b) in enumerate(zip(ar.rollouts, gen.rollouts)):
                assert b.tokens == a.tokens, f"{name} {mode} row {i}"


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_rows_are_independent_of_the_batch(on_device, mode, tiny_llama):
    model, mtp, _, _, _ = on_device
    prompts = [chat_ids(tiny_llama[1], t) for t in TEXTS + ["x"]]
    seeds = [101, 7, 55, 3]
    kw = dict(params=T1, mode=mode, draft=mtp, draft_len=3, eos_ids=[])
    batch = generate(model, prompts, 16, seed=seeds, **kw)
    for i, p in enumerate(prompts):
        alone = generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0]
        assert batch.rollouts[i].tokens == alone.tokens, f"row {i}"
        np.testing.assert_allclose(batch.rollouts[i].logprobs, alone.logprobs, atol=1e-4, rtol=0)
