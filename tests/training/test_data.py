"""make-data's resumable output: a rerun continues exactly, drops a line torn by a crash, and never leaves
meta.json disagreeing with the files; data_identity tells byte-identical data from other data."""

import json

import pytest

from bebop.training.data import data_identity, load_split, make_data
from bebop.errors import BebopError
from bebop.sampling import SamplingParams


def make(tiny_llama, out, n, heldout=2):
    model, tok = tiny_llama
    return make_data(model, tok, out, num_samples=n, heldout_samples=heldout, params=SamplingParams(1.0),
                     max_new_tokens=6, batch_size=3, seed=1, model_name="tiny-llama")


def test_rerun_continues_and_drops_a_torn_line(tiny_llama, tmp_path):
    make(tiny_llama, tmp_path / "whole", 5)
    make(tiny_llama, tmp_path / "parts", 3)
    path = tmp_path / "parts" / "train.jsonl"
    path.write_bytes(path.read_bytes()[:-7])  # killed in the middle of writing line 3
    make(tiny_llama, tmp_path / "parts", 5)
    for split in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "parts" / split).read_text() == (tmp_path / "whole" / split).read_text()
    assert json.loads((tmp_path / "parts" / "meta.json").read_text())["num_samples"]["train"] == 5
    assert data_identity(tmp_path / "parts")["sha256"] == data_identity(tmp_path / "whole")["sha256"]


def test_fewer_samples_or_other_settings_into_existing_data_are_refused(tiny_llama, tmp_path):
    make(tiny_llama, tmp_path / "d", 4)
    before = {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}
    with pytest.raises(BebopError, match="already holds 4 train sequences, more than the 2"):
        make(tiny_llama, tmp_path / "d", 2)
    model, tok = tiny_llama
    with pytest.raises(BebopError, match="other settings"):
        make_data(model, tok, tmp_path / "d", num_samples=4, heldout_samples=2, params=SamplingParams(0.5),
                  max_new_tokens=6, batch_size=3, seed=1, model_name="tiny-llama")
    assert {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()} == before  # nothing touched
    assert len(load_split(tmp_path / "d", "train")) == 4


def test_a_request_beyond_the_context_is_refused_before_generating(tiny_llama, tmp_path):
    model, tok = tiny_llama
    with pytest.raises(BebopError, match="exceeds the context"):
        make_data(model, tok, tmp_path / "d", num_samples=2, heldout_samples=1, max_new_tokens=model.max_len,
                  model_name="tiny-llama")
    assert not (tmp_path / "d" / "train.jsonl").exists()
