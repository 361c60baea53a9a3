import numpy as np
import pytest
import torch

from bebop.training import features
from bebop.training.features import TargetFeatures
from bebop.models.registry import load_model


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("tiny-llama", dtype="float32")
    return model


def rows(n, seed=0, vocab=259):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        plen, clen = 2 + i % 5, 3 + (7 * i) % 11
        ids = torch.randint(3, vocab, (plen + clen,), generator=g).tolist()
        out.append({"kind": ("math", "code")[i % 2], "prompt_ids": ids[:plen], "completion_ids": ids[plen:]})
    return out


def test_features_are_the_targets_hidden_states_in_bf16(tiny, tmp_path):
    data = rows(13)
    feats = TargetFeatures(tiny, data, 0.7, 64, layers=(0,), store=tmp_path / "f")
    assert all(isinstance(a, np.memmap) for a in (*feats.hidden.values(), feats.lse))  # on disk, not in memory
    tokens, lens, plens, hidden, lse, captured = feats.get([4, 0, 9])
    with torch.no_grad():
        full, layer0 = tiny.forward_full(tokens, capture=(0,))
        rounded = full.bfloat16().float()
        want_lse = (tiny.logits(rounded) / 0.7).logsumexp(-1)
    for j, n in enumerate(lens.tolist()):
        assert torch.equal(hidden[j, :n], rounded[j, :n])
        assert torch.equal(captured[j, :n], layer0[j, :n].bfloat16().float())
        torch.testing.assert_close(lse[j, :n], want_lse[j, :n])
        assert hidden[j, n:].abs().sum() == 0  # right padding is zero
    assert plens.tolist() == [len(data[i]["prompt_ids"]) for i in (4, 0, 9)]
    assert feats.kinds[:2] == ["math", "code"]


def test_an_interrupted_computation_resumes_to_the_same_store(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(features, "BLOCK", 4)
    data = rows(18)
    whole = TargetFeatures(tiny, data, 1.0, 64, layers=(0,), store=tmp_path / "whole")
    real, calls = TargetFeatures._forward, {"n": 0}

    def crash_on_third_batch(self, *a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(TargetFeatures, "_forward", crash_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        TargetFeatures(tiny, data, 1.0, 64, layers=(0,), store=tmp_path / "crashed")
    monkeypatch.setattr(TargetFeatures, "_forward", real)
    done = []
    monkeypatch.setattr(TargetFeatures, "_forward", lambda self, model, part, capture: (done.extend(part),
                                                                                        real(self, model, part, capture)))
    resumed = TargetFeatures(tiny, data, 1.0, 64, layers=(0,), store=tmp_path / "crashed")
    assert 0 < min(done) and sorted(done) == list(range(min(done), 18))  # only the unfinished blocks again
    for layer in whole.hidden:
        assert np.array_equal(whole.hidden[layer], resumed.hidden[layer])
    assert np.array_equal(whole.lse, resumed.lse)


def test_a_store_is_reused_only_for_the_same_sequences(tiny, tmp_path, monkeypatch):
    TargetFeatures(tiny, rows(6), 1.0, 64, layers=(0,), store=tmp_path / "f")
    computed = []
    real = TargetFeatures._forward
    monkeypatch.setattr(TargetFeatures, "_forward", lambda self, *a: (computed.append(1), real(self, *a)))
    TargetFeatures(tiny, rows(6), 1.0, 64, store=tmp_path / "f")  # a subset of the stored layers: reused
    assert not computed
    other = TargetFeatures(tiny, rows(6, seed=1), 1.0, 64, store=tmp_path / "f")  # other tokens: recomputed
    assert computed
    tokens, lens, _, hidden, _, captured = other.get([0])
    with torch.no_grad():
        assert torch.equal(hidden[0], tiny.forward_full(tokens)[0].bfloat16().float())
    assert captured is None
    computed.clear()
    TargetFeatures(tiny, rows(6, seed=1), 0.5, 64, store=tmp_path / "f")  # another temperature: recomputed
    assert computed
