"""The trainer's bf16 autocast probe asks the CPU first: where bf16 would run emulated it answers fp32 without timing
anything (an emulated forward+backward took minutes per probe on an AVX2-only CPU); elsewhere it times both."""

import copy

import pytest

from bebop.models import cpu
from bebop.rl.trainer import AUTOCAST_CACHE, autocast_choice, bf16_autocast_is_faster


def test_no_native_bf16_answers_fp32_without_running_the_model(monkeypatch, tiny_llama):
    policy = copy.deepcopy(tiny_llama[0])
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    monkeypatch.setattr(policy, "forward_full", lambda *a, **k: pytest.fail("timed an emulated bf16 pass"))
    use_bf16, probe = bf16_autocast_is_faster(policy, 2, 8)
    assert use_bf16 is False and "not timed" in probe["bf16"]


def test_native_bf16_times_both(monkeypatch, tiny_llama):
    policy = copy.deepcopy(tiny_llama[0]).requires_grad_(True)  # the trainer's policy
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)
    use_bf16, probe = bf16_autocast_is_faster(policy, 2, 8)
    assert isinstance(use_bf16, bool) and probe["fp32_s"] > 0 and probe["bf16_s"] > 0
    assert all(p.grad is None for p in policy.parameters())


def test_the_answer_is_cached_per_machine_and_model(monkeypatch, tiny_llama, tmp_path):
    policy = copy.deepcopy(tiny_llama[0]).requires_grad_(True)
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)
    first = autocast_choice(policy, 2, 8, tmp_path)
    assert (tmp_path / AUTOCAST_CACHE).is_file() and first[1]["fp32_s"] > 0
    def probed_again(*args, **kwargs):
        raise RuntimeError("probed again")

    monkeypatch.setattr(policy, "forward_full", probed_again)
    assert autocast_choice(policy, 2, 8, tmp_path) == first  # read back: the same answer and timings
    with pytest.raises(RuntimeError, match="probed again"):  # another micro-batch is another question
        autocast_choice(policy, 4, 8, tmp_path)
