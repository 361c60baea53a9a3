"""Acceptance vs. policy entropy: the study behind `bebop analyze entropy`.

The claim under test: the draft's acceptance rate falls roughly linearly as the
policy's (target's) entropy rises, and it falls much faster for greedy drafting
(x = argmax q, accepted with probability p(x)) than for probabilistic drafting
(x ~ q, accepted with min(1, p/q), overall probability alpha = sum_v min(p, q)).

Input is a trace: one row per examined draft position, a dict of equal-length
1-D numpy arrays (see TABLE_COLUMNS). Every acceptance number here is an
expected acceptance probability computed from the full p and q at that position
(token_stats), not the coin flip of the actual run, so both drafting modes are
measured on the same tokens; the actual run's `accepted` flag is only reported
as a sanity check (for a probabilistic run its mean should track mean alpha).

Which draft positions go into the fits: depth 0 only, by default. Position 0 is
examined for every draft block, so its rows are an unbiased sample of the
policy's tokens. Position k > 0 is only examined when positions 0..k-1 were
accepted in the actual run, so deeper rows over-represent easy (low-entropy)
contexts, and their q is conditioned on a draft prefix the policy agreed with.
Mixing them in would tilt the entropy/acceptance relationship by a selection
effect that depends on the run's drafting mode. Deeper positions are still
summarised, per run and per depth, separately.
"""

from bebop.sampling import token_stats  # the per-token quantities studied here
from bebop.studies.entropy.collect import collect
from bebop.studies.entropy.fit import (MIN_RUNS_FOR_RUN_VERDICT, STAT_COLUMNS, TABLE_COLUMNS, binned_means,
                                       fit_line, summarize)
from bebop.studies.entropy.report import read_table, write_report

__all__ = ["MIN_RUNS_FOR_RUN_VERDICT", "STAT_COLUMNS", "TABLE_COLUMNS", "binned_means", "collect", "fit_line",
           "read_table", "summarize", "token_stats", "write_report"]
