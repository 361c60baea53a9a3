"""What this machine's CPU is and which optional kernels it can run, asked of torch before anything is timed.

Machines of one kind come with different CPUs (an Intel Xeon with AMX, an AMD EPYC with avx512_bf16, an AMD
EPYC with AVX2 only), and a kernel that exists on one raises on another: oneDNN's packed bf16 linear refuses a
CPU without avx512bw/vl/dq or avx_ne_convert ("bf16 path needs the cpu support ..."), while plain bf16 matmuls
run there, emulated and slowly. So the probe (bebop.models.tuning) offers a kernel only where these queries say
it can run, its cache key carries `capability()`, and every speed figure is printed next to `describe()`.
Tests pretend a poorer CPU by replacing `packs_bf16_linears` / `native_bf16` / `amx_bf16_linears` /
`onednn_linears` / `vllm_cpu_attention` (callers look them up here at call time).
"""

import functools
import importlib.util
import os
import platform
from pathlib import Path

import torch


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name", as `lscpu` shows it), else platform's answer."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def capability() -> str:
    """The vector ISA torch's own kernels dispatch to here: "AVX512", "AVX2", "DEFAULT" (no vector kernels),
    "ZVECTOR", "SVE256", ... (`ATEN_CPU_CAPABILITY` can lower it)."""
    return torch.backends.cpu.get_cpu_capability()


@functools.cache  # asked on every linear told to pack where packing is refused: torch.ops lookups cost us
def native_bf16() -> bool:
    """Whether oneDNN computes bf16 natively here (x86: avx512bw/vl/dq or avx_ne_convert; ARM: the bf16
    extension). Elsewhere bf16 runs, converted in software: slower than fp32 on every CPU measured so far."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def packs_bf16_linears() -> bool:
    """Whether oneDNN's pre-packed bf16 linear (`mkldnn._reorder_linear_weight`) can run here: it needs
    native bf16, and this torch build must have the op."""
    return native_bf16() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def amx() -> bool:
    """Intel's matrix units (AMX tiles), which oneDNN's bf16 kernels use where present."""
    return bool(torch.cpu._is_amx_tile_supported())


# vLLM's CPU wheel builds its kernel library three times, for what the CPU runs: it loads the first whose
# needs this CPU meets (vllm.platforms.cpu's import_kernels). Here "AVX512"/"AVX2" is torch's capability()
# (which follows ATEN_CPU_CAPABILITY, so a CPU told to run AVX2 code gets the AVX2 build); only "_C" has the
# AMX bf16 GEMM.
VLLM_LIBRARIES = (("_C", "AVX512", True), ("_C_AVX512", "AVX512", False), ("_C_AVX2", "AVX2", False))


@functools.cache
def vllm_library() -> str | None:
    """Which build of vLLM's CPU kernel library (VLLM_LIBRARIES) fits this CPU: "_C" needs AVX-512 with
    native bf16 (avx512_bf16, and oneDNN allowed to use it: `ONEDNN_MAX_CPU_ISA=AVX2` forbids it), "_C_AVX512"
    AVX-512, "_C_AVX2" AVX2; None on other CPUs."""
    bf16 = torch.cpu._is_avx512_bf16_supported() and native_bf16()
    return next((name for name, isa, needs_bf16 in VLLM_LIBRARIES
                 if capability() == isa and (bf16 or not needs_bf16)), None)


# what vLLM asks of torch to pick its kernel build and attention kernels (vllm.platforms.cpu, cpu_attn)
VLLM_CPU_QUERIES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported")


def show_vllm_this_capability() -> None:
    """Make vLLM, in this process and those it spawns, load the kernel build bebop loads (vllm_library). vLLM asks
    the CPU's own flags (torch.cpu's queries read cpuinfo), bebop torch's capability(), which ATEN_CPU_CAPABILITY
    lowers: with `ATEN_CPU_CAPABILITY=avx2` on an AVX-512 CPU (an AVX2-only CPU emulated), vLLM alone would still
    run its AVX-512 build, so a comparison would time AVX-512 code against AVX2 code, and a process where bebop
    had loaded the AVX2 build would load a second. There vLLM's queries answer as on an AVX2-only CPU; elsewhere
    nothing changes. Call before vLLM is imported, at the top of the module a vLLM process runs (its spawned
    processes import that module again)."""
    if capability() == "AVX2" and torch.cpu._is_avx512_supported():
        for query in VLLM_CPU_QUERIES:
            setattr(torch.cpu, query, lambda: False)


@functools.cache
def vllm_cpu_ops() -> bool:
    """Whether vLLM's CPU kernels are loaded (`torch.ops._C`, from the `vllm-cpu` package, the `bebop-rl[vllm]`
    extra), in the build for this CPU (vllm_library): its oneDNN matmul, its attention over a paged cache, its
    RMS norm, and with avx512_bf16 its AMX bf16 GEMM (SGLang's `weight_packed_linear`). Only the kernel
    library is loaded (milliseconds), not vLLM's Python package. False where vLLM is absent, no build fits
    this CPU, or the library does not load."""
    spec, library = importlib.util.find_spec("vllm"), vllm_library()
    if spec is None or spec.origin is None or library is None:
        return False
    try:
        torch.ops.load_library(str(Path(spec.origin).parent / f"{library}.abi3.so"))
    except (OSError, RuntimeError):  # another torch's build, or a vLLM without CPU kernels
        return False
    return hasattr(torch.ops._C, "rms_norm")


@functools.cache
def vllm_cpu_attention() -> bool:
    """Whether vLLM's CPU attention over a paged KV cache (`cpu_attention_with_kv_cache` and its cache writer)
    is loaded (vllm_cpu_ops)."""
    return vllm_cpu_ops() and all(hasattr(torch.ops._C, op) for op in (
        "cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache", "get_scheduler_metadata"))


@functools.cache  # asked on every linear told to use it where it cannot run
def amx_bf16_linears() -> bool:
    """Whether the AMX bf16 linear (vLLM's `weight_packed_linear`) can run here: AMX tiles and vLLM's CPU
    kernels."""
    return amx() and vllm_cpu_ops() and hasattr(torch.ops._C, "weight_packed_linear") \
        and hasattr(torch.ops._C, "convert_weight_packed")


@functools.cache
def onednn_linears() -> bool:
    """Whether vLLM's oneDNN matmul (`create_onednn_mm_handler` / `onednn_mm`, what vLLM multiplies its dense
    projections with on x86 CPUs) is loaded (vllm_cpu_ops): every build has it; it multiplies bf16 only where
    oneDNN computes bf16 natively (native_bf16), fp32 everywhere."""
    return vllm_cpu_ops() and all(hasattr(torch.ops._C, op) for op in (
        "create_onednn_mm_handler", "onednn_mm", "release_dnnl_matmul_handler"))


def features() -> list[str]:
    """The CPU features a bf16 or int8 kernel choice turns on, as /proc/cpuinfo names them."""
    found = [name for name, query in (("avx512_bf16", torch.cpu._is_avx512_bf16_supported),
                                      ("amx", amx), ("vnni", torch.cpu._is_vnni_supported)) if query()]
    return found + (["native bf16"] if native_bf16() else ["bf16 emulated"])


# the variables that make torch, MKL and oneDNN run lower instruction sets than the CPU has (an AVX2-only CPU
# emulated on an AVX-512 one: ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def describe() -> str:
    """One line for logs and result files, e.g. "AVX512 (avx512_bf16, amx, vnni, native bf16)", naming the
    ISA_LIMITS that are set (a figure measured under them is an emulation)."""
    limits = [f"{name}={os.environ[name]}" for name in ISA_LIMITS if os.environ.get(name)]
    return f"{capability()} ({', '.join(features() + (['limited by ' + ' '.join(limits)] if limits else []))})"
