"""bebop.models.cpu's capability queries under the variables that make torch, MKL and oneDNN run their AVX2 code on
an AVX-512 machine (how bebop's AVX2 path is measured without an AVX2 machine): they must answer as on a CPU with
AVX2 only, or kernels that oneDNN then refuses are chosen and fail at their first call."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
ASK = ("import json, torch; from bebop.models import cpu, kernels; f32, bf16, here = torch.float32, torch.bfloat16, "
       "torch.device('cpu'); print(json.dumps(dict(capability=cpu.capability(), native_bf16=cpu.native_bf16(), "
       "packs=cpu.packs_bf16_linears(), library=cpu.vllm_library(), vllm_ops=cpu.vllm_cpu_ops(), "
       "amx=cpu.amx_bf16_linears(), onednn_fp32=kernels.onednn_weights(f32, here), "
       "onednn_bf16=kernels.onednn_weights(bf16, here), paged_fp32=kernels.paged_runs(f32, here, 64), "
       "paged_bf16=kernels.paged_runs(bf16, here, 64), describe=cpu.describe())))")


def answers(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", ASK], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_avx2_variables_make_every_query_answer_as_on_an_avx2_cpu():
    """No bf16 kernel is offered, and vLLM's kernels come from its AVX2 build (vLLM is installed with the tests),
    whose fp32 matmul and attention are offered."""
    got = answers(AVX2_ONLY)
    assert got["capability"] == "AVX2", got
    assert not any(got[k] for k in ("native_bf16", "packs", "amx", "onednn_bf16", "paged_bf16")), got
    assert got["library"] == "_C_AVX2", got
    assert got["vllm_ops"] and got["onednn_fp32"] and got["paged_fp32"], got
    assert "bf16 emulated" in got["describe"] and "ATEN_CPU_CAPABILITY=avx2" in got["describe"], got


LOADED = ("import json, runpy, torch; from bebop.models import cpu; "
          "runpy.run_module('bebop.backends.vllm.engine', run_name='__mp_main__'); "  # as a process vLLM spawns
          "from vllm.platforms import current_platform; current_platform.import_kernels(); "
          "print(json.dumps(dict(bebop=cpu.vllm_library(), "
          "vllm=sorted({l.rsplit('/', 1)[-1].split('.')[0] for l in open('/proc/self/maps') if '/vllm/_C' in l}))))")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
@pytest.mark.parametrize("env", [{}, AVX2_ONLY], ids=["this CPU", "AVX2 variables"])
def test_vllms_processes_load_the_kernel_build_bebop_loads(env):
    """vLLM picks its build by the CPU's flags; under the AVX2 variables its processes must still load the AVX2
    build, as bebop does, or an emulated AVX2 comparison times vLLM's AVX-512 code."""
    out = subprocess.run([sys.executable, "-c", LOADED], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["vllm"] == [got["bebop"]], got
    if env:
        assert got["bebop"] == "_C_AVX2", got
