"""bebop.drafts.registry: drafts saved and loaded back (weights, architecture, reduced vocabulary, older
checkpoints), and checkpoints that do not fit the target or cannot be read refused with a clear error."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.errors import BebopError
from bebop.models.registry import load_model
from bebop.drafts.registry import load_mtp, new_mtp


def test_checkpoint_round_trip_and_reduced_vocab(tiny, tmp_path):
    mtp = new_mtp(tiny, seed=3)
    mtp.set_draft_vocab(torch.tensor([5, 2, 9, 40, 2]))
    mtp.save(tmp_path / "m", loss="tv")
    back = load_mtp(tmp_path / "m", tiny)
    assert back.vocab_ids.tolist() == [2, 5, 9, 40]
    assert back.config.meta["loss"] == "tv"
    for (k, a), (_, b) in zip(mtp.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    h = torch.randn(3, tiny.cfg.dim)
    q = back.full_vocab(back.draft_logits(h).softmax(-1))
    assert q.shape == (3, tiny.cfg.vocab_size)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    outside = torch.ones(tiny.cfg.vocab_size, dtype=torch.bool)
    outside[back.vocab_ids] = False
    assert q[:, outside].abs().max() == 0


def test_checkpoint_round_trip_of_the_architecture(tiny, tmp_path):
    mtp = new_mtp(tiny, seed=4, layers=2, feature_layers=(1, 0))
    mtp.save(tmp_path / "m")
    back = load_mtp(tmp_path / "m", tiny)
    assert (back.config.layers, back.feature_layers) == (2, (1, 0))
    for (k, a), (_, b) in zip(mtp.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    # a checkpoint from before multi-block MTPs names its one block "block."
    one = new_mtp(tiny, seed=5)
    one.save(tmp_path / "old")
    state = {k.replace("blocks.0.", "block."): v for k, v in load_file(str(tmp_path / "old.safetensors")).items()}
    save_file(state, str(tmp_path / "old.safetensors"), metadata={"save_id": json.loads((tmp_path / "old.json").read_text())["save_id"]})
    old = load_mtp(tmp_path / "old", tiny)
    for (k, a), (_, b) in zip(one.state_dict().items(), old.state_dict().items()):
        assert torch.equal(a, b), k
    # feature layers the model does not have
    raw = json.loads((tmp_path / "m.json").read_text())
    raw["feature_layers"] = [0, 7]
    (tmp_path / "m.json").write_text(json.dumps(raw))
    with pytest.raises(BebopError, match="does not fit"):
        load_mtp(tmp_path / "m", tiny)


def test_mismatched_or_broken_checkpoint_is_a_clear_error(tiny, tmp_path):
    other, _ = load_model("tiny-qwen3", dtype="float32")
    new_mtp(other).save(tmp_path / "qwen")
    with pytest.raises(BebopError, match="does not fit"):
        load_mtp(tmp_path / "qwen", tiny)
    with pytest.raises(BebopError, match="needs both"):
        load_mtp(tmp_path / "missing", tiny)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BebopError, match="cannot read"):
        load_mtp(tmp_path / "bad", tiny)
