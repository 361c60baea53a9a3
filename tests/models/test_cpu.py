"""bebop.models.cpu's capability queries under the variables that make torch, MKL and oneDNN run their AVX2 code on
an AVX-512 machine (how bebop's AVX2 path is measured without an AVX2 machine): they must answer as on a CPU with
AVX2 only, or kernels that oneDNN then refuses are chosen and fail at their first call."""

import json
import os
import subprocess
import sys

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
ASK = ("import json; from bebop.models import cpu; print(json.dumps(dict(capability=cpu.capability(), "
       "native_bf16=cpu.native_bf16(), packs=cpu.packs_bf16_linears(), vllm_ops=cpu.vllm_cpu_ops(), "
       "onednn=cpu.onednn_bf16_linears(), amx=cpu.amx_bf16_linears(), attention=cpu.vllm_cpu_attention(), "
       "describe=cpu.describe())))")


def answers(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", ASK], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_avx2_variables_make_every_query_answer_as_on_an_avx2_cpu():
    got = answers(AVX2_ONLY)
    assert got["capability"] == "AVX2", got
    assert not any(got[k] for k in ("native_bf16", "packs", "vllm_ops", "onednn", "amx", "attention")), got
    assert "bf16 emulated" in got["describe"], got

