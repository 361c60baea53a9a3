"""A ragged verify over a paged cache, packed (each row's real tokens only; vLLM's kernel takes each row's own
number of queries) against padded (every row pays the longest row's tokens, as before): the same generations,
interleaved in one run, the padded arms with Decoder.packs as it was (a paged cache never packed).

    python examples/packed_verify_ab.py history   (16 rows of the sequence task, T = 0.7, up to 320 tokens: six
                                                   epoch-1 generations per arm from one epoch-0 history)
    python examples/packed_verify_ab.py chat      (the held-out chat prompts, T = 1, 64 tokens, 16 and 64 rows)

Prints each arm's summed time per token over ar's (and the tokens it wrote). The arms share the drafts' cost
tables where they share a draft.
"""
import copy
import sys
import time

import torch
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft
from bebop.drafts.registry import trained_draft, load_draft
from bebop.engine.draft_len import probe_buckets
import bebop.engine.generation as G
from bebop.models.decoder import Decoder
from bebop.models.registry import chat_ids, load_model
from bebop.models import cpu
from bebop.sampling import SamplingParams
from bebop.tasks import rl_tasks, load_prompts_file
new_packs = Decoder.packs
old_packs = lambda self, cache: not cache.paged and not self.compiled
model, tok = load_model("smollm2-135m", dtype="auto")
print(cpu.cpu_model(), cpu.describe(), torch.get_num_threads(), model.embed.weight.dtype, model.attention, flush=True)
trained = trained_draft(model)
def gen(prompts, n, params, draft, seed, packs, kmax=4):
    Decoder.packs = new_packs if packs else old_packs
    t = time.perf_counter()
    g = G.generate(model, prompts, n, params, mode="ar" if draft is None else "spec", draft=draft, draft_len="auto", max_draft_len=kmax, seed=seed)
    return time.perf_counter() - t, g.stats.tokens
def report(tot, label):
    base = tot["ar"][0] / tot["ar"][1]
    print(label, {k: round(base / (v[0] / v[1]), 3) for k, v in tot.items()}, {k: v[1] for k, v in tot.items()}, flush=True)
which = sys.argv[1]
if which == "chat":
    texts = load_prompts_file("results/prompts/heldout-handwritten.jsonl")
    params = SamplingParams(temperature=1.0)
    for B in (16, 64):
        prompts = [chat_ids(tok, t) for t in texts] * 2
        probe_buckets(model, trained, B, 4)
        tot = {}
        for rep in range(4):
            for arm in ["ar", "spec-padded", "spec-packed"]:
                ps = prompts[rep * 7 % len(texts):][:B]
                s, n = gen(ps, 64, params, None if arm == "ar" else trained, 11 + rep, arm.endswith("packed"))
                a = tot.setdefault(arm, [0, 0]); a[0] += s; a[1] += n
        report(tot, f"chat rows {B}:")
else:
    tasks = rl_tasks("sequence", 2, seed=0, split="train")
    prompts = [chat_ids(tok, t.prompt) for t in tasks for _ in range(8)]
    params = SamplingParams(temperature=0.7)
    probe_buckets(model, HistoryDraft(), 16, 4); probe_buckets(model, trained, 16, 4)
    h = HistoryDraft()
    for d in (h, trained, None): gen(prompts, 320, params, d, 999, True)
    h.prompts.clear()
    gen(prompts, 320, params, h, 1000, True)  # epoch 0 fills the history
    tot = {}
    for rep in range(3):
        for arm in ["ar", "history-padded", "history-packed", "hybrid-padded", "hybrid-packed"]:
            for seed in (1001, 1002):
                d = None if arm == "ar" else copy.deepcopy(h) if arm.startswith("history") else HybridDraft(trained, copy.deepcopy(h))
                s, n = gen(prompts, 320, params, d, seed + 10 * rep, arm.endswith("packed"))
                a = tot.setdefault(arm, [0, 0]); a[0] += s; a[1] += n
        report(tot, f"epoch-1 rep {rep}:")
