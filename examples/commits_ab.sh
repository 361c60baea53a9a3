#!/bin/bash
# Plain decoding (ar) of the default model at BATCH rows: the code of an earlier commit against this checkout's,
# in alternating processes (4 rounds, 3 timed repetitions each, eager, the hand-written held-out prompts, T=1,
# 64 new tokens, EOS stops), each side with its own kernel probe and model cache, as a fresh install has. For
# "nothing got slower" on a CPU kind: compare the two sides' tok/s round by round.
#   bash examples/commits_ab.sh COMMIT BATCH
# (an old commit's CLI is used as it was: before `--compile` existed its bench ran eager, as --compile 0 does now)
set -e
OLD=$1 BATCH=$2 HERE=$(pwd) TMP=$(mktemp -d)
git worktree add -f -q $TMP/old $OLD
trap "git worktree remove --force $TMP/old; rm -rf $TMP" EXIT
PROMPTS=$HERE/results/prompts/heldout-handwritten.jsonl
for round in 0 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then dir=$TMP/old; extra=; else dir=$HERE; extra="--compile 0"; fi
    (cd $dir && PYTHONPATH=$dir BEBOP_CACHE=$TMP/cache-$side $HERE/.venv/bin/python -m bebop.cli bench \
       --model smollm2-135m --prompts $PROMPTS --batch-sizes $BATCH --modes ar --max-new-tokens 64 --temperature 1.0 \
       --repeats 3 --seed 11 $extra 2>/dev/null | grep -E "^ar |linear" | sed "s/^/$side $(git rev-parse --short HEAD) round $round: /")
  done
done
