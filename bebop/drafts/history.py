"""A draft read from earlier rollouts of the same prompt (`HistoryDraft`): no model, nothing to train.

RL samples the same prompts epoch after epoch, G samples at a time, and the samples of a prompt share much of
their text (the answer's format, the steps of a method, the prompt's own words). Per prompt this draft keeps
what followed each context of `min_order`..`max_order` tokens in that prompt's rollouts: every rollout it was
given (`add`; earlier epochs, a resumed run's checkpoint) and, while a generation runs, what each of its rows
has emitted so far (`begin` / `Recording.update`), so a row drafts from its group's other samples. A row's
proposal follows the longest context its own text ends with that the table holds and takes the token that
most often came next there, then again from the text so extended, for up to k tokens, until no context
matches, or until the chance that every draft so far is accepted falls below `min_chain` (`propose`). That
chance is estimated by the product of each draft's share of what followed its context: the history holds
samples of the policy, so a share estimates the policy's probability of the token there, which is what a
one-hot draft is accepted with; corrected by how often drafts from matches of that kind were accepted so far
(`Calibration`: a long match is a better witness than a short one).

Terminology as in vLLM's n-gram and suffix drafters. Proposals are deterministic, so q is one-hot: the
rejection rule accepts a drafted x with probability p(x) and otherwise samples from p without x. That is
exact whatever the table holds, as the table only holds text emitted before the step that verifies it.

Memory is bounded: at most `max_tokens_per_prompt` tokens per prompt (the oldest rollouts go first) and
`max_prompts` prompts (the least recently used go first). `save` / `load` keep the rollouts themselves, from
which the table is rebuilt, so a resumed run drafts as an uninterrupted one.
"""

import json
from collections import OrderedDict, deque
from pathlib import Path
from typing import NamedTuple

from bebop.errors import BebopError
from bebop.io import write_text_atomic

NO_TOKEN = 0  # what pads a row's drafts past its own draft length (never accepted; any valid id would do)


class Proposal(NamedTuple):
    tokens: list[int]  # the drafts
    chances: list[float]  # the chance that the drafts up to each are all accepted
    kinds: list[tuple[tuple[int, int], float]]  # per draft: its match's kind (Calibration.kind) and its share


class Calibration:
    """How often a history draft's drafts were accepted against what their shares promised, per kind of match:
    the context's length and how often that context was seen, each in powers of two. A draft's chance is its
    share times its kind's accepted / promised ratio, that ratio shrunk towards 1 by `weight` promised drafts'
    worth of prior. Measured on smollm2-135m's code rollouts (16 rows, T = 1, three epochs): drafts from
    one-token contexts were accepted 0.19 of the time where their shares promised 0.40, drafts from contexts
    of six tokens or more 0.87-0.95 where theirs promised 0.61-0.86."""

    def __init__(self, weight: float = 8.0):
        self.weight = weight
        self.counts: dict[tuple[int, int], list[float]] = {}  # kind -> [accepted, promised]

    @staticmethod
    def kind(order: int, seen: int) -> tuple[int, int]:
        return min(order.bit_length(), 4), min(seen.bit_length(), 4)

    def chance(self, kind: tuple[int, int], share: float) -> float:
        accepted, promised = self.counts.get(kind, (0.0, 0.0))
        return min(1.0, share * (accepted + self.weight) / (promised + self.weight))

    def observe(self, kind: tuple[int, int], share: float, accepted: bool) -> None:
        counts = self.counts.setdefault(kind, [0.0, 0.0])
        counts[0] += accepted
        counts[1] += share


class PromptHistory:
    """One prompt's rollouts and the table of what followed each context in them."""

    def __init__(self, prompt: tuple[int, ...], max_order: int):
        self.prompt, self.max_order = prompt, max_order
        self.completions: deque[list[int]] = deque()  # oldest first; a live rollout's list grows in place
        self.next: dict[tuple[int, ...], dict[int, int]] = {}  # context -> {next token: count}
        self.size = 0  # tokens in `completions`

    def index(self, completion: list[int], start: int, min_order: int) -> None:
        """Count completion[start:], each token after its contexts of min_order..max_order tokens (reaching
        back into the prompt)."""
        text = self.prompt[-self.max_order:] + tuple(completion)
        offset = len(text) - len(completion)
        for i in range(offset + start, len(text)):
            token = text[i]
            for n in range(min_order, min(self.max_order, i) + 1):
                counts = self.next.setdefault(text[i - n:i], {})
                counts[token] = counts.get(token, 0) + 1
        self.size += len(completion) - start


class Recording:
    """A rollout being written: `update` indexes the tokens it gained since the last call."""

    def __init__(self, draft: "HistoryDraft", history: PromptHistory):
        self.draft, self.history, self.tokens = draft, history, []
        history.completions.append(self.tokens)

    def update(self, completion: list[int]) -> None:
        start = len(self.tokens)
        if len(completion) > start:
            self.tokens.extend(completion[start:])
            self.history.index(self.tokens, start, self.draft.min_order)
            self.draft.evict(self.history)


class HistoryDraft:
    """Drafts from the text that followed the same context in earlier rollouts of the same prompt (see the
    module doc). `learn`: whether a generation adds its rollouts as it writes them and calibrates its chances
    on the drafts' outcomes (off: a fixed table and calibration, so that a row's drafts depend on its own text
    alone)."""

    arch = "history"

    def __init__(self, max_order: int = 8, min_order: int = 1, min_chain: float = 0.3,
                 max_tokens_per_prompt: int = 65536, max_prompts: int = 4096, learn: bool = True):
        if not 1 <= min_order <= max_order:
            raise BebopError(f"a history draft needs 1 <= min_order <= max_order, got {min_order} and {max_order}")
        if max_tokens_per_prompt < 1 or max_prompts < 1:
            raise BebopError("a history draft needs room for at least one token and one prompt")
        if not 0 <= min_chain <= 1:
            raise BebopError(f"a history draft's min_chain is a probability, got {min_chain}")
        self.max_order, self.min_order, self.min_chain = max_order, min_order, min_chain
        self.max_tokens_per_prompt, self.max_prompts, self.learn = max_tokens_per_prompt, max_prompts, learn
        self.prompts: OrderedDict[tuple[int, ...], PromptHistory] = OrderedDict()  # least recently used first
        self.calibration = Calibration()

    def history(self, prompt) -> PromptHistory:
        key = tuple(prompt)
        if key not in self.prompts:
            self.prompts[key] = PromptHistory(key, self.max_order)
            if len(self.prompts) > self.max_prompts:
                self.prompts.popitem(last=False)
        self.prompts.move_to_end(key)
        return self.prompts[key]

    def begin(self, prompt) -> Recording:
        """A new rollout of `prompt`, indexed as it grows (Recording.update)."""
        return Recording(self, self.history(prompt))

    def add(self, prompt, completion) -> None:
        """A finished rollout of `prompt`."""
        self.begin(prompt).update(list(completion))

    def evict(self, history: PromptHistory) -> None:
        """Past the cap, drop the prompt's oldest rollouts (all but the newest) and rebuild its table."""
        if history.size <= self.max_tokens_per_prompt:
            return
        while len(history.completions) > 1 and history.size > self.max_tokens_per_prompt // 2:
            history.size -= len(history.completions.popleft())
        history.next, history.size = {}, 0
        for completion in history.completions:
            history.index(completion, 0, self.min_order)

    def propose(self, prompt, completion: list[int], k: int) -> Proposal:
        """Up to k tokens to follow prompt + completion: at each depth the most frequent next token of the
        longest context of max_order..min_order tokens the prompt's table holds (ties: the smaller id); fewer
        where no context matches or where the chance that all drafts so far are accepted would fall below
        min_chain. With the tokens, those chances: the product of the drafts' calibrated shares (Calibration),
        a share being the token's count over one more than its context's (a context seen once promises 1/2,
        not certainty); and each draft's kind of match and share, for `observe`."""
        history = self.prompts.get(tuple(prompt))
        out = Proposal([], [], [])
        if history is None or k <= 0:
            return out
        text = list(history.prompt[-self.max_order:]) + list(completion[-self.max_order:])
        chain = 1.0
        while len(out.tokens) < k:
            order, counts = next(((n, history.next[c]) for n in range(min(self.max_order, len(text)),
                                                                       self.min_order - 1, -1)
                                  if (c := tuple(text[len(text) - n:])) in history.next), (0, None))
            if counts is None:
                break
            token = max(counts, key=lambda t: (counts[t], -t))
            seen = sum(counts.values())
            share, kind = counts[token] / (seen + 1), Calibration.kind(order, seen)
            chain *= self.calibration.chance(kind, share)
            if chain < self.min_chain:
                break
            out.tokens.append(token)
            out.chances.append(chain)
            out.kinds.append((kind, share))
            text.append(token)
        return out

    def observe(self, kinds: list[list[tuple[tuple[int, int], float]]], num_accepted: list[int]) -> None:
        """After a step: each row's verified drafts (their `Proposal.kinds`) and how many of them were
        accepted; the drafts up to the first rejected one calibrate the chances (when the draft learns)."""
        if not self.learn:
            return
        for row, n in zip(kinds, num_accepted):
            for i, (kind, share) in enumerate(row[:n + 1]):
                self.calibration.observe(kind, share, i < n)

    # ----- checkpoints: the rollouts themselves; the tables are rebuilt from them -----
    def state(self) -> dict:
        return {"max_order": self.max_order, "min_order": self.min_order, "min_chain": self.min_chain,
                "max_tokens_per_prompt": self.max_tokens_per_prompt, "max_prompts": self.max_prompts,
                "prompts": [[list(h.prompt), [list(c) for c in h.completions if c]] for h in self.prompts.values()],
                "calibration": [[list(kind), *counts] for kind, counts in self.calibration.counts.items()]}

    @classmethod
    def from_state(cls, state: dict, learn: bool = True) -> "HistoryDraft":
        draft = cls(state["max_order"], state["min_order"], state["min_chain"], state["max_tokens_per_prompt"],
                    state["max_prompts"], learn)
        for prompt, completions in state["prompts"]:
            for completion in completions:
                draft.add(prompt, completion)
        draft.calibration.counts = {tuple(kind): [accepted, promised]
                                    for kind, accepted, promised in state.get("calibration", [])}
        return draft

    def save(self, path: str | Path) -> None:
        write_text_atomic(Path(path), json.dumps(self.state()))

    @classmethod
    def load(cls, path: str | Path, learn: bool = True) -> "HistoryDraft":
        try:
            return cls.from_state(json.loads(Path(path).read_text()), learn)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BebopError(f"cannot read a history draft from {path}: {e}") from None

    def __repr__(self) -> str:
        tokens = sum(h.size for h in self.prompts.values())
        return f"HistoryDraft({len(self.prompts)} prompts, {tokens} tokens, orders {self.min_order}..{self.max_order})"
