"""The default model's GGUF -> Hugging Face directory, bebop's one-pass conversion (`new`) against transformers' own
GGUF loader (`old`, what bebop used before), in one process each; run them interleaved:

    for r in 1 2; do for w in old new; do .venv/bin/python examples/gguf_conversion_ab.py $w; done; done
"""

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

which = sys.argv[1]
t = time.perf_counter()
from bebop.models.registry import smollm2_gguf  # noqa: E402 (timed from here: bebop's import included)

folder, g = smollm2_gguf()
out = Path(tempfile.mkdtemp())
if which == "new":
    from bebop.models import gguf_llama
    gguf_llama.convert(os.path.join(folder, g), out / "m")
else:  # the loader bebop used before: transformers' GGUF loader, then save
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from safetensors.torch import save_file
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=g)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=g, dtype=torch.float32)
    (out / "m").mkdir()
    del model.config.quantization_config
    model.config.save_pretrained(out / "m")
    tok.save_pretrained(out / "m")
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, out / "m" / "model.safetensors")
print(which, round(time.perf_counter() - t, 1))
