"""The engine tests' shared model (`warm`)."""

import pytest

from generation_helpers import agreeable_mtp, sharpened


@pytest.fixture(scope="module")
def warm(tiny_qwen3):
    """tiny-qwen3 sharpened (entropy ~3.3 nats against log V = 5.6) with an MTP that is often right."""
    model = sharpened(tiny_qwen3[0], 15.0)
    return model, agreeable_mtp(model, 1.0, 0.0), tiny_qwen3[1]
