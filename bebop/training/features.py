"""The frozen target's features for MTP training, computed once and stored compactly on disk.

The target never changes while its MTP trains, so its hidden states for every training sequence are computed
in one pass (the `compute_model` may be a bf16 copy of the target, where this CPU runs that faster) and read
back per batch. A store is a directory:
    meta.json        what was computed (sequences, temperature, model, dtype, layers) and how far it got
    layer{i}.bin     the output of target layer i for every token of every sequence, bf16 [tokens, d]
    lse.bin          log-sum-exp of the target's logits / T at every token, fp32 [tokens]
The .bin files are memory-mapped: training memory does not grow with the data, and the OS pages in only the
batches read. The last layer is always stored (the teacher distribution comes from it); an EAGLE-3 MTP also
needs the layers it reads (its `feature_layers`). Computation goes in blocks of sequences and records each
finished block, so an interrupted run resumes where it stopped; a store made for other sequences, another
temperature or model is recomputed from scratch.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bebop.engine.scheduler import right_pad
from bebop.io import write_text_atomic

BLOCK = 256  # sequences per resumable block (sorted by length inside it: little padding)
BATCH_TOKENS = 4096  # padded tokens per forward


class TargetFeatures:
    def __init__(self, target, rows, temperature, max_seq_len, layers=(), store=None, progress=False,
                 compute_model=None):
        self.target, self.T = target, temperature
        self.seqs = [torch.tensor((r["prompt_ids"] + r["completion_ids"])[:max_seq_len]) for r in rows]
        self.prompt_lens = [len(r["prompt_ids"]) for r in rows]
        self.kinds = [r.get("kind", "?") for r in rows]
        self.captured = tuple(layers)  # the layers get() returns concatenated (an EAGLE-3 MTP's input)
        last = target.cfg.n_layers - 1
        lens = np.array([len(s) for s in self.seqs], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lens)])
        total = int(self.offsets[-1])
        ids = hashlib.sha256(np.concatenate([s.numpy() for s in self.seqs] or [np.zeros(0)]).tobytes()).hexdigest()
        model = compute_model or target
        self.key = {"n": len(self.seqs), "tokens": total, "ids_sha256": ids, "T": temperature, "L": max_seq_len,
                    "model": target.name, "dim": target.cfg.dim,
                    "dtype": str(model.embed.weight.dtype).removeprefix("torch.")}
        needed = sorted({last, *self.captured})
        self.store = None if store is None else Path(store)
        meta = self._meta()
        if meta is None or meta["key"] != self.key or not set(needed) <= set(meta["layers"]):
            meta = {"key": self.key, "layers": needed, "done_blocks": 0}
            if self.store is not None:  # a fresh store: other data or layers, so nothing in it can be kept
                self.store.mkdir(parents=True, exist_ok=True)
                for f in self.store.glob("*.bin"):
                    f.unlink()
        self.layers = meta["layers"]
        d = target.cfg.dim
        self.hidden = {i: self._array(f"layer{i}.bin", np.uint16, (total, d)) for i in self.layers}
        self.lse = self._array("lse.bin", np.float32, (total,))
        self.last = last
        blocks = (len(self.seqs) + BLOCK - 1) // BLOCK
        if meta["done_blocks"] < blocks:
            self._compute(model, meta, blocks, progress)

    def _meta(self):
        if self.store is None or not (self.store / "meta.json").exists():
            return None
        try:
            return json.loads((self.store / "meta.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None  # torn or foreign: recompute

    def _array(self, name, dtype, shape):
        if self.store is None:
            return np.zeros(shape, dtype=dtype)
        path = self.store / name
        mode = "r+" if path.exists() and path.stat().st_size == np.dtype(dtype).itemsize * int(np.prod(shape)) \
            else "w+"
        return np.memmap(path, dtype=dtype, mode=mode, shape=shape) if shape[0] else np.zeros(shape, dtype=dtype)

    @torch.no_grad()
    def _compute(self, model, meta, blocks, progress):
        capture = tuple(i for i in self.layers if i != self.last)
        bar = tqdm(total=len(self.seqs), initial=min(len(self.seqs), meta["done_blocks"] * BLOCK),
                   desc="target features", unit="seq", disable=not progress)
        for b in range(meta["done_blocks"], blocks):
            block = sorted(range(b * BLOCK, min((b + 1) * BLOCK, len(self.seqs))), key=lambda i: len(self.seqs[i]))
            start = 0
            while start < len(block):  # sorted by length: a batch's width is its last sequence's length
                end = start + 1
                while end < len(block) and (end + 1 - start) * len(self.seqs[block[end]]) <= BATCH_TOKENS:
                    end += 1
                self._forward(model, block[start:end], capture)
                bar.update(end - start)
                start = end
            meta["done_blocks"] = b + 1
            self._commit(meta)
        bar.close()

    def _forward(self, model, part, capture):
        tokens, lens = padded([self.seqs[i] for i in part])
        device = model.embed.weight.device
        out = model.forward_full(tokens.to(device), capture=capture)
        last, captured = out if capture else (out, None)
        outs = {self.last: last}
        for j, i in enumerate(capture):
            outs[i] = captured[..., j * last.shape[-1]:(j + 1) * last.shape[-1]]
        # stored as bf16; the log-normaliser is taken from the stored (rounded) last hidden state, so that the
        # teacher p rebuilt from it at training time sums to 1
        stored = {i: h.to(torch.bfloat16) for i, h in outs.items()}
        lse = (model.logits(stored[self.last].to(last.dtype)) / self.T).logsumexp(-1).float().cpu()
        for j, i in enumerate(part):
            a, n = int(self.offsets[i]), int(lens[j])
            for layer, h in stored.items():
                self.hidden[layer][a:a + n] = h[j, :n].cpu().view(torch.int16).numpy().view(np.uint16)
            self.lse[a:a + n] = lse[j, :n].numpy()

    def _commit(self, meta):
        if self.store is None:
            return
        for arr in (*self.hidden.values(), self.lse):
            if isinstance(arr, np.memmap):
                arr.flush()
        write_text_atomic(self.store / "meta.json", json.dumps(meta))  # a block is done once its bytes are on disk

    def _rows(self, arr, idx, width, dtype):
        out = torch.zeros(len(idx), width, *arr.shape[1:], dtype=dtype)
        for j, i in enumerate(idx):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            rows = torch.from_numpy(np.ascontiguousarray(arr[a:b]))
            out[j, :b - a] = rows.view(torch.bfloat16) if dtype == torch.bfloat16 else rows
        return out

    def get(self, idx: list[int], dtype=torch.float32):
        """A right-padded batch: tokens, lengths, prompt lengths, last hidden [B, S, d], lse [B, S] and the
        captured layers concatenated [B, S, n*d] (None without feature layers), on the target's device."""
        tokens, lens = padded([self.seqs[i] for i in idx])
        S, device = tokens.shape[1], self.target.embed.weight.device
        hidden = self._rows(self.hidden[self.last], idx, S, torch.bfloat16).to(device, dtype)
        lse = self._rows(self.lse, idx, S, torch.float32).to(device)
        captured = None
        if self.captured:
            captured = torch.cat([self._rows(self.hidden[i], idx, S, torch.bfloat16) for i in self.captured], -1)
            captured = captured.to(device, dtype)
        prompt_lens = torch.tensor([self.prompt_lens[i] for i in idx])
        return tokens.to(device), lens.to(device), prompt_lens.to(device), hidden, lse, captured


def padded(seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [N, longest] token ids of `seqs` (1-d tensors) and their lengths [N]."""
    return right_pad(seqs), torch.tensor([len(s) for s in seqs])
