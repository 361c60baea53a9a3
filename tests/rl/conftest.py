import json

import pytest

from bebop.models.registry import load_model


@pytest.fixture
def probed_tiny_llama(tmp_path, monkeypatch):
    """probed_tiny_llama(attention, linear, fp32_attention, fp32_linear): tiny-llama with a private cache whose
    dtype probe says bf16 with `attention` and `linear` (fp32 with `fp32_attention` and `fp32_linear`)."""
    def make(attention, linear, fp32_attention=("sdpa", "sdpa"), fp32_linear="plain"):
        from bebop.models import tuning

        monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
        policy, _ = load_model("tiny-llama", dtype="float32")
        key = tuning.cache_key("tiny-llama", policy.embed.weight.device)
        (tmp_path / tuning.CACHE_FILE).write_text(json.dumps({key: {
            "attention_for": {"float32": list(fp32_attention), "bfloat16": list(attention)},
            "linear_for": {"float32": fp32_linear, "bfloat16": linear}}}))
        return policy

    return make
