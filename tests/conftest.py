"""Shared, session-scoped models, and the markers of tests that are slow or need vLLM or Ray. The transformers
models are returned too (test_models compares against them); SmolLM2 is loaded once per session because loading
it costs seconds. Tests must not modify these models in place: build a copy (see `sharpened` in
engine/generation_helpers.py) when a test needs different weights."""

import copy
import os
from pathlib import Path


def pin_xdist_worker():
    """Under `pytest -n N` (pytest-xdist: `make test` runs the tests that start neither vLLM nor Ray so) each
    worker gets its own share of the cores, so that no test's threads, nor the processes it starts, compete with
    another worker's. Done before torch loads: its OpenMP runtime sizes its spinning to the cores it sees, and two
    threads spinning on one core they believe is two run 10-20x slower."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        i = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[i::workers] or [cores[i % len(cores)]])


pin_xdist_worker()

import pytest  # noqa: E402
import torch  # noqa: E402

from bebop.models import registry  # noqa: E402
from bebop.models.decoder import Decoder  # noqa: E402


# The test models are small: one thread is about as fast as two, and on a shared 2-core machine two OpenMP
# threads competing with another busy process run 10-20x slower (spinning barriers). BEBOP_TEST_THREADS overrides.
TEST_THREADS = int(os.environ.get("BEBOP_TEST_THREADS", "1"))
torch.set_num_threads(TEST_THREADS)

TESTS = Path(__file__).parent
# the markers of pyproject.toml, by test file (a folder ends in /), test function or fixture
VLLM_TESTS = ("backends/vllm/test_engine.py", "backends/vllm/test_worker.py",
              "rl/workers/test_ray.py::test_two_ray_workers_with_vllm_each_on_its_core")
VLLM_FIXTURES = {"vllm_model_dir"}  # a model directory for vLLM's engine or its paged-attention kernels
RAY_TESTS = ("rl/workers/test_ray.py",)
# the tests whose vLLM engine or Ray cluster starts processes that size themselves to every core
SPAWN_TESTS = VLLM_TESTS + RAY_TESTS + ("integrations/test_trl.py::test_two_grpo_steps_with_vllm_generating",)
SLOW_TESTS = ("models/test_compiled.py",  # torch.compile
              "engine/test_generation.py::test_spec_on_the_compiled_step_matches_exact_distribution_and_ar")
SLOW_FIXTURES = {"smollm2"}  # SmolLM2-135M: loading it and generating with it on one thread


def _matches(item, paths) -> bool:
    path = item.path.relative_to(TESTS).as_posix()
    name = f"{path}::{item.originalname}"
    return any(path.startswith(p) if p.endswith("/") else p in (path, name) for p in paths)


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(item.fixturenames)
        if _matches(item, VLLM_TESTS) or fixtures & VLLM_FIXTURES:
            item.add_marker(pytest.mark.vllm)
        if _matches(item, RAY_TESTS):
            item.add_marker(pytest.mark.ray)
        if _matches(item, SPAWN_TESTS):
            item.add_marker(pytest.mark.spawns)
        compiled = getattr(item, "callspec", None) is not None and item.callspec.params.get("compiled") is True
        if _matches(item, SLOW_TESTS) or fixtures & SLOW_FIXTURES or compiled:  # compiled: the torch.compile'd step
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Every test's probes and cost tables go to one cache for the session, not the user's ~/.cache/bebop:
    a test must not leave entries for its temporary models there, nor read the machine's real probes (CI
    starts with none). A test that sets BEBOP_CACHE itself overrides this."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("BEBOP_CACHE", str(base / "bebop-cache"))
    # torch.compile's code is shared by the session's workers (the same graphs compile once; the cache is
    # safe for concurrent use) and starts empty, as on a fresh machine
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared / "inductor"))


@pytest.fixture(autouse=True)
def thread_budget():
    """A test that sets torch's thread count (run_rl splits the cores) leaves the next test the suite's."""
    yield
    torch.set_num_threads(TEST_THREADS)


# The devices the accelerator tests run on (tests/*/test_*_on_accelerators.py): CUDA, skipped with a reason where torch
# sees no GPU; BEBOP_TEST_DEVICES=cpu runs the same tests on the CPU (which the rest of the suite covers already)
TEST_DEVICES = os.environ.get("BEBOP_TEST_DEVICES", "cuda").split(",")


@pytest.fixture(scope="module", params=TEST_DEVICES)
def accelerator(request):
    """A torch device the accelerator tests run on (TEST_DEVICES)."""
    device = torch.device(request.param)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU here (BEBOP_TEST_DEVICES=cpu runs these tests on the CPU)")
    return device


def _build(name):
    hf, tok = registry.load_hf(name)
    decoder = Decoder.from_hf(hf)
    decoder.name = name
    decoder.eos_ids = registry.eos_ids(tok, hf.generation_config)  # as registry.load_model does
    return hf, decoder, tok


_LOADED = {}


def loaded(name):
    """(transformers model, Decoder, tokenizer) for a registry name, built once per session."""
    if name not in _LOADED:
        _LOADED[name] = _build(name)
    return _LOADED[name]


@pytest.fixture(scope="session")
def load_models():
    """The `loaded` function, as a fixture (test modules should not import conftest)."""
    return loaded


@pytest.fixture(scope="session")
def tiny_llama():
    """(Decoder, tokenizer) for tiny-llama."""
    _, model, tok = loaded("tiny-llama")
    return model, tok


@pytest.fixture(scope="session")
def tiny_qwen3():
    _, model, tok = loaded("tiny-qwen3")
    return model, tok


@pytest.fixture(scope="session")
def smollm2():
    _, model, tok = loaded("smollm2-135m")
    return model, tok


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A tiny Llama (tiny-llama's family and byte tokenizer) saved as a Hugging Face directory for vLLM to load,
    with a head size vLLM's CPU attention has kernels for (32; tiny-llama's 16 has none)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = registry.byte_tokenizer()
    config = AutoConfig.for_model("llama", vocab_size=len(tok), max_position_embeddings=4096, hidden_size=64,
                                  intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-llama-hf")
    AutoModelForCausalLM.from_config(config).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def _perturbed(model, scale=0.05, seed=0):
    """A copy of `model` with seeded noise added to every weight: the trainer's weights after updates a
    rollout engine has not received (the sync checks must catch it)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


@pytest.fixture(scope="session")
def perturbed():
    """The `_perturbed` function, as a fixture."""
    return _perturbed
