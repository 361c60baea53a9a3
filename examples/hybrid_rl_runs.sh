#!/bin/bash
# GRPO with hybrid drafts (the shipped EAGLE-3 draft, frozen, and a history of the run's own rollouts) against
# plain sampling (`ar`), same seed, on the long-answer task over a fixed prompt set that comes back every four
# steps (25 epochs in 100 steps), 16 rollouts a step (2 prompts x 8); then `bebop report`: rewards per step,
# the end-to-end speedup per generated token and its Amdahl bound. The two runs take turns, 25 steps at a time
# (each chunk ends on an evaluation), so a shared machine's drift falls on both alike; every chunk resumes from
# the run's last checkpoint, the history included, so a kill loses at most 5 steps: run this again to continue.
#   bash examples/hybrid_rl_runs.sh            (hours on 2 cores; one heavy job: pause it for benchmarks)
#   STEPS=4 CHUNK=2 R=/tmp/hybrid-rl bash examples/hybrid_rl_runs.sh   (a smoke test)
set -e
BEBOP=${BEBOP:-.venv/bin/bebop}
R=${R:-results/rl-hybrid-sequence-smollm2-135m} STEPS=${STEPS:-100} CHUNK=${CHUNK:-25}
mkdir -p $R

rl() {  # name, the steps to reach, then the run's own options
  local out=$R/$1 until=$2; shift 2
  [ -f $out/metrics.jsonl ] && [ "$(wc -l < $out/metrics.jsonl)" -ge $until ] && return
  local resume=; [ -d $out/ckpt ] && resume=--resume
  $BEBOP rl --model smollm2-135m --task sequence --steps $until --prompts-per-step 2 --num-generations 8 \
    --num-train-prompts 8 --max-completion-length 320 --temperature 0.7 --learning-rate 1e-5 \
    --eval-every $CHUNK --eval-prompts 16 --save-every 5 --seed 0 --async-mode off --out $out $resume "$@"
}
for until in $(seq $CHUNK $CHUNK $STEPS); do
  rl hybrid $until --rollout spec --draft hybrid --draft-len auto --max-draft-len 4
  rl ar $until --rollout ar
done
$BEBOP report $R/hybrid $R/ar --out $R/report
