"""`bebop demo`: plain against speculative GRPO rollouts on this machine, and a verdict (bebop.studies.demo)."""

from dataclasses import replace

from bebop.cli.checks import at_least, check_output_dir, check_seed
from bebop.studies.demo import run_demo
from bebop.studies.demo_config import DemoConfig


def cmd_demo(args):
    check_output_dir(args.out, "--out")
    check_seed(args)
    at_least(args, 1, "rounds")
    print(run_demo(args.out, replace(DemoConfig(), rounds=args.rounds, seed=args.seed, device=args.device)))
