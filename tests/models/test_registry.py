"""bebop.models.registry: a Hugging Face id (`owner/name`) loads from the local Hugging Face cache, offline; one
that is not cached is one clear error naming the cache and how to fill it."""

import pytest

from bebop.errors import BebopError
from bebop.models import registry

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hugging Face hub cache holding `bebop-test/tiny-llama` (the seeded tiny model), laid out as
    huggingface_hub lays it out: models--OWNER--NAME/{refs/main, snapshots/COMMIT/...}."""
    cache = tmp_path / "hub"
    repo = cache / "models--bebop-test--tiny-llama"
    snapshot = repo / "snapshots" / COMMIT
    model, tok = registry.tiny_model("tiny-llama")
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_cached_hugging_face_id_loads_as_the_model_it_holds(hub):
    registry.check_model("bebop-test/tiny-llama")
    assert registry.hf_dir("bebop-test/tiny-llama") == hub / "models--bebop-test--tiny-llama" / "snapshots" / COMMIT
    model, _ = registry.load_model("bebop-test/tiny-llama", dtype="float32")
    tiny, _ = registry.load_model("tiny-llama", dtype="float32")
    assert model.name == "bebop-test/tiny-llama"
    assert (model.embed.weight == tiny.embed.weight).all()


def test_an_uncached_hugging_face_id_is_one_line_naming_the_cache_and_the_fix(hub):
    with pytest.raises(BebopError) as e:
        registry.load_model("Qwen/Qwen3-0.6B")
    message = str(e.value)
    assert "\n" not in message
    assert str(hub) in message and "hf download Qwen/Qwen3-0.6B" in message
    with pytest.raises(BebopError, match="not in the local Hugging Face cache"):
        registry.check_model("Qwen/Qwen3-0.6B")


def test_a_local_path_with_a_slash_is_not_taken_for_a_hugging_face_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert not registry.is_hub_id("models/mine")
    assert registry.is_hub_id("Qwen/Qwen3-0.6B")
    assert not registry.is_hub_id("./x/y") and not registry.is_hub_id("/abs/path")
    with pytest.raises(BebopError, match="not a Hugging Face model directory"):
        registry.check_model("models/mine")
