"""The drafts tests' shared target (`tiny`)."""

import pytest

from bebop.models.registry import load_model


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("tiny-llama", dtype="float32")
    return model
