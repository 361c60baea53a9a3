"""Speculative-decoding counters, named as vLLM names them: one `SpecStats` per generation, added up over
batches, shards and repetitions, and built from vLLM's own spec-decode counters, so that every backend reports
the same figures computed the same way.

Counters: `steps` speculative steps (target verification forwards per row; vLLM's num_drafts), `drafted` draft
tokens proposed (num_draft_tokens), `accepted` draft tokens accepted (num_accepted_tokens), `accepted_at[i]`
steps in which draft i + 1 was accepted (num_accepted_tokens_per_pos), `tokens` tokens emitted and
`entropy_sum` the entropies (nats) of their sampling distributions (None where a backend does not measure them).
"""

from dataclasses import dataclass, field
from itertools import zip_longest


@dataclass
class SpecStats:
    draft_len: int = 0
    steps: int = 0  # target verification forwards (speculative steps), per row
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # steps in which draft i was accepted
    tokens: int = 0
    entropy_sum: float | None = 0.0  # None: not measured (vLLM)
    history_drafted: int = 0  # of `drafted`, those a hybrid draft took from its history
    history_accepted: int = 0  # of `accepted`, those

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.steps for a in self.accepted_at] if self.steps else []

    @property
    def mean_draft_len(self) -> float | None:  # K per speculative step (varies under draft_len="auto")
        return self.drafted / self.steps if self.steps else None

    @property
    def mean_entropy(self) -> float | None:
        return self.entropy_sum / self.tokens if self.tokens and self.entropy_sum is not None else None

    def summary(self) -> dict:
        return {"acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance, "mean_entropy": self.mean_entropy,
                "mean_draft_len": self.mean_draft_len, "drafted": self.drafted, "accepted": self.accepted,
                "steps": self.steps, "tokens": self.tokens, "history_drafted": self.history_drafted,
                "history_accepted": self.history_accepted}

    def count_step(self, K: int, num_accepted, draft_lens=None, from_history=None) -> None:
        """One speculative step of K drafts over len(num_accepted) rows; num_accepted [B] drafts each kept;
        draft_lens [B]: each row's own draft length where rows differ (a row with none made a plain step);
        from_history [B] (bool): the rows a hybrid draft's history drafted."""
        if from_history is not None and bool(from_history.any()):
            lens = draft_lens if draft_lens is not None else num_accepted.new_full(num_accepted.shape, K)
            self.history_drafted += int(lens[from_history].sum())
            self.history_accepted += int(num_accepted[from_history].sum())
        if draft_lens is None:
            self.steps += len(num_accepted)
            self.drafted += K * len(num_accepted)
        else:
            self.steps += int((draft_lens > 0).sum())
            self.drafted += int(draft_lens.sum())
        self.accepted += int(num_accepted.sum())
        for i in range(K):
            self.accepted_at[i] += int((num_accepted > i).sum())

    def add(self, other: "SpecStats") -> None:
        """Add `other`'s counts to these (a position only one of them drafted counts from that one alone)."""
        self.draft_len = max(self.draft_len, other.draft_len)
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.accepted_at = [a + b for a, b in zip_longest(self.accepted_at, other.accepted_at, fillvalue=0)]
        self.tokens += other.tokens
        self.history_drafted += other.history_drafted
        self.history_accepted += other.history_accepted
        unmeasured = self.entropy_sum is None or other.entropy_sum is None
        self.entropy_sum = None if unmeasured else self.entropy_sum + other.entropy_sum

    @classmethod
    def total(cls, parts) -> "SpecStats":
        """The sum of several SpecStats (shards of one batch, repetitions of one run)."""
        out = cls()
        for part in parts:
            out.add(part)
        return out

    @classmethod
    def from_summary(cls, summary: dict) -> "SpecStats":
        """The counters behind a `summary()` (what crosses a process boundary), to add summaries up."""
        steps, tokens, mean_entropy = summary["steps"], summary["tokens"], summary["mean_entropy"]
        per_position = summary["per_position_acceptance"]
        return cls(draft_len=len(per_position), steps=steps, drafted=summary["drafted"],
                   accepted=summary["accepted"], accepted_at=[a * steps for a in per_position], tokens=tokens,
                   entropy_sum=None if mean_entropy is None and tokens else (mean_entropy or 0.0) * tokens,
                   history_drafted=summary.get("history_drafted", 0),
                   history_accepted=summary.get("history_accepted", 0))

    @classmethod
    def from_vllm(cls, counters: dict) -> "SpecStats":
        """From vLLM's spec-decode counters {"drafts", "drafted", "accepted", "accepted_at"} (as
        bebop.backends.vllm.engine.spec_counters reads them); vLLM counts no tokens and measures no entropy."""
        return cls(draft_len=len(counters["accepted_at"]), steps=counters["drafts"], drafted=counters["drafted"],
                   accepted=counters["accepted"], accepted_at=list(counters["accepted_at"]), entropy_sum=None)
