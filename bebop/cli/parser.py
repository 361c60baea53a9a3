"""The `bebop` argument parser: every command's flags, their defaults and help, and the argument types.

One name per idea across commands (TRL's names where TRL has one, vLLM's where it fits):
  --draft                    the draft checkpoint (or 'random', 'random-eagle3')
  --draft-len                draft tokens per step (alias: --num-speculative-tokens, vLLM's name)
  --learning-rate            an optimizer's learning rate
  --max-new-tokens           tokens generated per prompt (rl: --max-completion-length, per completion, as TRL)
  --num-samples              samples or sequences drawn; --num-prompts / --*-prompts count prompts
  --output                   a file written; --out a directory (or checkpoint prefix) written
Old spellings stay accepted for one release as hidden aliases that print one "deprecated" line (deprecated(),
and DEPRECATED_COMMANDS for command names).
"""

import argparse
import sys

from bebop.engine.modes import MODES
from bebop.rl.config import (ASYNC_MODES, AUTOCAST, BACKENDS, DTYPES, LOSS_TYPES, DRAFT_STRATEGIES, ROLLOUTS,
                             SCALE_REWARDS, RLConfig)
from bebop.studies.demo_config import DemoConfig
from bebop.training.config import TrainConfig

DESCRIPTION = """bebop: faster RL rollouts for small language models by speculative decoding. A small draft model
proposes tokens and the policy verifies them exactly, so samples follow the policy's distribution. Train a draft
for your model (make-data, train-draft), generate or benchmark with it, and run GRPO with speculative rollouts (rl).

Every command checks its options before any model loads; bad input gets one error line and exit status 2."""


# an old command name -> its name now; both run the same command
DEPRECATED_COMMANDS = {"train-mtp": "train-draft"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default ("(default: X)"), options without help text included."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if unset or not action.option_strings or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing option, 'abc' for a number) in the same one-line form as ours; every
    command's help shows defaults (HelpFormatter)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # a prefix of one option must not silently mean another
        super().__init__(*args, **kwargs)

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"bebop: error: {command}{message}", file=sys.stderr)
        sys.exit(2)


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: still sets the same value, and says once on stderr which name to use."""

    def __init__(self, option_strings, dest, new, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bebop: deprecated: {option_string}: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def deprecated(p, old, new):
    """Accept `old` as a hidden, deprecated spelling of the option `new` already added to `p`."""
    a = p._option_string_actions[new]
    p.add_argument(old, dest=a.dest, type=a.type, choices=a.choices, metavar=a.metavar, action=DeprecatedAlias,
                   new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


DEVICE_HELP = "where the model runs: auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"


def add_model_args(p, draft=True, dtype=True, compile=True, device=True, compile_default="0"):
    """--model, and the options of the commands that use them: --draft, --dtype, --compile (where neither it nor
    $BEBOP_COMPILE is given: `compile_default`), --device."""
    p.add_argument("--model", default="smollm2-135m", help="registry name or local Hugging Face model directory")
    if device:
        p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if draft:
        p.add_argument("--draft", default=None, help="the draft: an MTP checkpoint (NAME.safetensors + NAME.json), an EAGLE-3 "
                   "directory (config.json + *.safetensors, as SpecForge writes and `bebop export` writes), 'random' or "
                   "'random-eagle3' (seeded fresh drafts), 'history' (no model: each row drafts what followed its text "
                   "in the other samples of its prompt, generate/bench/check-exactness), 'hybrid' (the shipped trained "
                   "draft and a history, each row and step the one that promises more); default: the model's shipped "
                   "trained draft (smollm2-135m: EAGLE-3); a speculative mode on a model without one is refused")
    if dtype:
        p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weights and activations for generating (generate, bench, make-data); auto: bfloat16 where a "
                        "short probe, cached per machine and model, measures it faster, else float32")
    if compile:
        add_compile_arg(p, compile_default)
    if draft:
        deprecated(p, "--mtp", "--draft")


def add_compile_arg(p, default="0"):
    """--compile, whose default (where neither it nor $BEBOP_COMPILE is given) is `default`."""
    p.add_argument("--compile", default=None, choices=("0", "auto", "1"),
                   help="the compiled decode step: 1 on, 0 eager, auto where the --dtype auto probe times it faster "
                        f"(default: $BEBOP_COMPILE, else {default}); a first compile takes minutes, later runs reuse it")
    p.set_defaults(compile_default=default)


def draft_len_arg(text: str):
    """--draft-len: an int, or 'auto' (chosen every step by cost, up to --max-draft-len)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got '{text}'") from None


def add_sampling_args(p, temperature=1.0, max_new_tokens=True, draft_len=True):
    p.add_argument("--temperature", type=float, default=temperature, help="sampling temperature (0: argmax)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of tokens with this much probability (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens (0: off)")
    if draft_len:
        p.add_argument("--draft-len", "--num-speculative-tokens", type=draft_len_arg, default="auto", help="drafts per step, or 'auto'")
    if max_new_tokens:
        p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt at most")
    p.add_argument("--seed", type=int, default=0, help="random seed")


def add_rl_args(p):
    d = RLConfig()
    p.add_argument("--model", default=d.model, help="registry name or local Hugging Face model directory")
    p.add_argument("--device", default=d.device, help=DEVICE_HELP + " (the trainer and the rollouts share it)")
    add_compile_arg(p)  # (the rollouts' decode step; the trainer's forward stays eager)
    p.add_argument("--draft", default=d.draft, help="the draft, as for generate: a checkpoint, an EAGLE-3 directory, 'random', "
                   "'random-eagle3', 'history' (no model: each row drafts what followed its text in the earlier "
                   "rollouts of its prompt, learnt as the run goes and saved with its checkpoints) or 'hybrid' (the "
                   "shipped draft, frozen, and such a history, each row and step the one that promises more); default: the model's "
                   "shipped draft (EAGLE-3 for smollm2-135m), required with --draft-strategy frozen on a model without "
                   "one (online strategies train a random one)")
    p.add_argument("--task", default=d.task, help="RL task (arithmetic, code, sequence)")
    p.add_argument("--difficulty", default=d.difficulty, help="task difficulty level (default: the task's)")
    p.add_argument("--steps", type=int, default=d.steps, help="GRPO steps")
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step, help="prompts per step (each gets --num-generations completions)")
    p.add_argument("--num-train-prompts", type=int, default=d.num_train_prompts, help="training prompts, taken in turn: "
                   "each comes back every num-train-prompts / prompts-per-step steps (epochs); 0: steps x "
                   "prompts-per-step, each once")
    p.add_argument("--num-generations", type=int, default=d.num_generations, help="G: completions per prompt")
    p.add_argument("--max-completion-length", type=int, default=d.max_completion_length, help="tokens per completion at most")
    p.add_argument("--temperature", type=float, default=d.temperature, help="rollout sampling temperature")
    p.add_argument("--learning-rate", type=float, default=d.learning_rate, help="policy learning rate (AdamW)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm, help="gradient norm clip")
    p.add_argument("--beta", type=float, default=d.beta, help="KL coefficient to the initial policy")
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="clip range")
    p.add_argument("--epsilon-high", type=float, default=d.epsilon_high, help="upper clip range (default: epsilon)")
    p.add_argument("--loss-type", default=d.loss_type, help=f"{'|'.join(LOSS_TYPES)}")
    p.add_argument("--scale-rewards", default=d.scale_rewards, help=f"{'|'.join(SCALE_REWARDS)}")
    p.add_argument("--num-iterations", type=int, default=d.num_iterations, help="updates per batch of rollouts")
    p.add_argument("--importance-sampling-cap", type=float, default=d.importance_sampling_cap,
                   help="truncated importance sampling cap between rollout and training log-probs")
    p.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size, help="sequences per forward/backward in the update")
    p.add_argument("--autocast", default=d.autocast, help=f"{'|'.join(AUTOCAST)}: bf16 autocast for training "
                                                          "(auto: a short probe picks the faster)")
    p.add_argument("--rollout", default=d.rollout, help=f"{'|'.join(ROLLOUTS)}")
    p.add_argument("--rollout-backend", default=d.rollout_backend,
                   help=f"{'|'.join(BACKENDS)}: the engine that generates rollouts (vllm: EAGLE-3 drafts only, "
                        "default the model's shipped one; its log goes to OUT/vllm.log)")
    p.add_argument("--draft-len", "--num-speculative-tokens", type=draft_len_arg, default=d.draft_len,
                   help="draft tokens per step, or 'auto' (chosen every step by cost, up to --max-draft-len; "
                        "with --rollout-backend vllm, which has no automatic K, auto is the draft's trained depth, else "
                        "--max-draft-len)")
    p.add_argument("--max-draft-len", type=int, default=d.max_draft_len,
                   help="the largest K --draft-len auto may pick (and the depth an online draft strategy trains)")
    p.add_argument("--ray", nargs="?", const="local", default=d.ray, metavar="ADDRESS",
                   help="rollout workers as Ray actors (pip install 'bebop-rl[ray]'): no ADDRESS starts a local Ray, 'auto' joins "
                        "the running cluster, or host:port")
    p.add_argument("--rollout-workers", type=int, default=d.rollout_workers,
                   help="Ray rollout actors; the rollout threads are split between them")
    p.add_argument("--draft-strategy", default=d.draft_strategy,
                   help=f"{'|'.join(DRAFT_STRATEGIES)}: keep the pre-RL draft, or train it on each step's rollouts")
    p.add_argument("--draft-learning-rate", type=float, default=d.draft_learning_rate,
                   help="learning rate of an online draft strategy (AdamW)")
    p.add_argument("--async-mode", default=d.async_mode, help=f"{'|'.join(ASYNC_MODES)}")
    p.add_argument("--rollout-dtype", default=d.rollout_dtype,
                   help=f"auto|{'|'.join(DTYPES)} (auto: as --dtype auto chooses for the model on this machine)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads in all (0: the usable CPUs); "
                                                                   "one-step splits them between the two processes")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out evaluation period (0: first/last)")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts, help="held-out prompts per evaluation")
    p.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint period in steps (0: the end only)")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.add_argument("--out", required=True, help="output directory: metrics, checkpoints, logs")
    p.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    deprecated(p, "--mtp", "--draft")
    deprecated(p, "--mtp-strategy", "--draft-strategy")
    deprecated(p, "--mtp-learning-rate", "--draft-learning-rate")


def add_train_args(p):
    d = TrainConfig()
    p.add_argument("--data", required=True, help="directory written by `bebop make-data`")
    p.add_argument("--draft-len", type=int, default=d.draft_len, help="tokens the draft predicts ahead (its trained depth)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per training step")
    p.add_argument("--learning-rate", type=float, default=d.lr, help="learning rate (AdamW)")
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab,
                   help="restrict the draft head to the N most frequent training tokens (0 = full vocabulary)")
    p.add_argument("--max-seq-len", type=int, default=d.max_seq_len, help="longest training sequence, in tokens")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="evaluation period in steps")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts,
                   help="held-out prompts for real speculative acceptance")
    p.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint period in steps")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.add_argument("--eval-sequences", type=int, default=d.eval_sequences,
                   help="held-out sequences for teacher-forced acceptance")
    p.add_argument("--kind", default=d.kind, choices=("mtp", "eagle3"),
                   help="the draft kind: mtp (DeepSeek-V3 layout, bebop's engine) or eagle3 (LlamaForCausalLMEagle3, "
                   "which vLLM and SGLang load: `bebop export`); eagle3 reads 3 target layers, by default vLLM's")
    p.add_argument("--mtp-layers", type=int, default=d.mtp_layers,
                   help="decoder blocks of a fresh MTP (DeepSeek-V3: 1)")
    p.add_argument("--feature-layers", default=",".join(map(str, d.feature_layers)),
                   help="target layers a fresh MTP reads, concatenated and projected (EAGLE-3), e.g. 2,15,29; "
                   "default: the last hidden state alone")
    # the CLI picks the faster of these on this machine (auto); the library keeps them off
    p.add_argument("--features-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the target forward that computes the training features (auto: the faster here)")
    p.add_argument("--autocast", default="auto", choices=("auto", "bf16", "off"),
                   help="bf16 autocast of training steps over fp32 weights (auto: if a probe finds it faster)")
    deprecated(p, "--lr", "--learning-rate")
    deprecated(p, "--arch", "--kind")


def build_parser():
    version = sys.modules["bebop"].__version__  # the package this parser belongs to, loaded before it
    parser = Parser(prog="bebop", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"bebop {version}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    p = sub.add_parser("demo", help="plain against speculative GRPO rollouts on this machine, ending with a verdict")
    p.add_argument("--out", default="runs/demo", help="a new directory for the runs, the report and verdict.md")
    p.add_argument("--rounds", type=int, default=DemoConfig.rounds,
                   help=f"interleaved rounds of {DemoConfig.steps_per_round} steps of each run (more: steadier figures)")
    p.add_argument("--seed", type=int, default=DemoConfig.seed, help="random seed")
    p.add_argument("--device", default=DemoConfig.device, help=DEVICE_HELP)
    p.set_defaults(func="demo:cmd_demo")

    p = sub.add_parser("generate", help="sample completions (plain or speculative)")
    add_model_args(p)
    p.add_argument("--prompt", help="one prompt (or use --prompts)")
    p.add_argument("--prompts", help="JSONL file, one {\"prompt\": ...} per line")
    p.add_argument("--num-samples", type=int, default=1, help="completions per prompt")
    p.add_argument("--mode", choices=MODES, default="spec", help="ar: plain sampling; spec: sampled drafts, exact speculative sampling; spec-greedy: argmax "
                   "drafts with exact probabilistic verification (samples still follow the model, not greedy decoding)")
    p.add_argument("--output", help="JSONL output (default: stdout)")
    p.add_argument("--max-batch", type=int, default=None, help="rows decoded at once; a finished row takes the "
                                                               "next waiting request (default: all at once)")
    p.add_argument("--max-draft-len", type=int, default=4, help="the largest K --draft-len auto may pick")
    add_sampling_args(p)
    p.set_defaults(func="generate:cmd_generate")

    p = sub.add_parser("bench", help="tokens/s and acceptance per mode and batch size, interleaved")
    add_model_args(p, compile_default="auto")  # a bench repays a compile: compiled where the probe times it faster
    p.add_argument("--batch-sizes", default="1,4,16", help="comma-separated batch sizes to measure")
    p.add_argument("--modes", default="ar,spec,spec-greedy",
                   help="any of ar, spec, spec-greedy (argmax drafts, exact verification), hf (transformers), vllm (vLLM's plain decoding), vllm-spec "
                        "(vLLM with the draft's EAGLE-3 export; vLLM has no auto K: it drafts --draft-len, 3 for auto), "
                        "vllm-ngram (vLLM's n-gram drafter, contexts of 1-8 tokens, --draft-len as for vllm-spec); "
                        "ar-compiled, spec-compiled: on the compiled decode step, against the others run eager")
    p.add_argument("--prompts", help="JSONL prompts (default: built-in held-out task prompts)")
    p.add_argument("--repeats", type=int, default=3, help="measurements per mode and batch size")
    p.add_argument("--output", help="JSON file to write the results to")
    deprecated(p, "--json", "--output")
    p.add_argument("--ignore-eos", action="store_true", help="every request generates exactly --max-new-tokens "
                                                             "(default: stop at EOS and count the tokens produced)")
    add_sampling_args(p)
    p.set_defaults(func="generate:cmd_bench")

    p = sub.add_parser("export", help="write a draft in the EAGLE-3 layout vLLM and SGLang load")
    add_model_args(p, dtype=False, compile=False, device=False)
    p.add_argument("--format", default="eagle3", choices=("eagle3",), help="the layout (SpecForge's EAGLE-3 directory)")
    p.add_argument("--out", required=True, help="directory to write config.json and model.safetensors to")
    p.set_defaults(func="generate:cmd_export")

    p = sub.add_parser("check-exactness", help="test that speculative sampling with this model and draft is lossless")
    add_model_args(p)
    p.add_argument("--mode", default="spec", help="spec (sampled drafts) or spec-greedy (argmax drafts, exact probabilistic verification)")
    p.add_argument("--prompt", default="Tell me a short story.", help="the prompt whose first tokens are sampled")
    p.add_argument("--num-samples", type=int, default=2000, help="samples per mode (more: more power)")
    p.add_argument("--max-new-tokens", type=int, default=3, help="tokens sampled per sample")
    p.add_argument("--alpha", type=float, default=1e-3, help="false-alarm rate of the whole family of tests")
    p.add_argument("--output", help="JSON file to write the p-values to")
    deprecated(p, "--json", "--output")
    deprecated(p, "--samples", "--num-samples")
    deprecated(p, "--tokens", "--max-new-tokens")
    p.add_argument("--draft-len", "--num-speculative-tokens", type=int, default=2,
                   help="draft tokens per step (a fixed K, so that every step drafts)")
    add_sampling_args(p, max_new_tokens=False, draft_len=False)
    p.set_defaults(func="generate:cmd_check_exactness")

    p = sub.add_parser("make-data", help="self-distillation data: the target's own samples")
    add_model_args(p, draft=False)
    p.add_argument("--prompts", default="builtin", help="'builtin' (chat, math and code tasks) or a JSONL file")
    p.add_argument("--mix", default=None, help="shares of the built-in kinds, e.g. math=0.4,code=0.3,chat=0.3 "
                   "(the default)")
    p.add_argument("--num-samples", type=int, default=512, help="training sequences")
    p.add_argument("--heldout-samples", type=int, default=64, help="held-out sequences for evaluation")
    p.add_argument("--batch-size", type=int, default=16, help="prompts generated at once")
    p.add_argument("--out", required=True, help="output directory for the data")
    add_sampling_args(p, draft_len=False)
    p.set_defaults(func="train:cmd_make_data")

    p = sub.add_parser("train-draft", aliases=[old for old, new in DEPRECATED_COMMANDS.items() if new == "train-draft"],
                       help="train a draft (EAGLE-3 or MTP) with ce, kl, tv, e2e-tv, lk or kl+e2e-tv")
    add_model_args(p, draft=False, dtype=False)
    add_train_args(p)
    p.add_argument("--loss", default=TrainConfig.loss, help="training loss: ce, kl, tv, e2e-tv, lk or kl+e2e-tv")
    p.add_argument("--out", required=True, help="checkpoint path prefix: OUT.safetensors, OUT.json, ...")
    p.add_argument("--init", help="start from this draft checkpoint")
    p.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    p.set_defaults(func="train:cmd_train_draft")

    p = sub.add_parser("compare-losses", help="train one MTP per loss on the same budget and compare acceptance")
    add_model_args(p, draft=False, dtype=False)
    add_train_args(p)
    p.add_argument("--losses", default="ce,kl,tv,e2e-tv,lk,kl+e2e-tv", help="comma-separated losses to compare "
                   "(with --seeds, each against the first)")
    p.add_argument("--seeds", type=int, default=1, help="drafts per loss, from training seeds --seed, --seed + 1, ...: "
                   "the losses compared on seed means with 95%% intervals")
    p.add_argument("--temperatures", default="0.6,1.0,1.2", help="comma-separated sampling temperatures to evaluate at")
    p.add_argument("--final-eval-prompts", type=int, default=32, help="held-out prompts for the final evaluation")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per held-out prompt in the final evaluation")
    p.add_argument("--out", required=True, help="output directory: one checkpoint per loss and the comparison")
    p.add_argument("--keep", help="a directory (e.g. under results/) where each finished draft's evaluation and "
                   "gzipped training metrics are copied as soon as it is done, and read back first: a comparison "
                   "goes on from these files on another machine, without the drafts")
    deprecated(p, "--eval-samples", "--final-eval-prompts")
    deprecated(p, "--eval-new-tokens", "--max-new-tokens")
    p.set_defaults(func="train:cmd_compare_losses")

    p = sub.add_parser("analyze", help="studies: `analyze entropy`")
    studies = p.add_subparsers(dest="study", required=True)
    p = studies.add_parser("entropy", help="acceptance vs the policy's entropy, probabilistic and greedy drafting")
    add_model_args(p, dtype=False)
    p.add_argument("--policy", action="append", default=[], help="another policy checkpoint (model directory) "
                                                                  "to study with the same MTP; repeatable")
    p.add_argument("--prompts", help="JSONL prompts (default: built-in held-out task prompts)")
    p.add_argument("--num-prompts", type=int, default=32, help="prompts studied")
    p.add_argument("--temperatures", default="0.4,0.6,0.8,1.0,1.2,1.4,1.6", help="comma-separated sampling temperatures")
    p.add_argument("--draft-len", type=int, default=3, help="draft tokens per step")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the fit intervals")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", required=True, help="output directory for the study")
    p.set_defaults(func="analyze:cmd_analyze_entropy")

    p = sub.add_parser("rl", help="GRPO with plain or speculative rollouts, synchronous or one step off-policy")
    add_rl_args(p)
    p.set_defaults(func="rl:cmd_rl")

    p = sub.add_parser("report", help="compare RL runs: Markdown, JSON and plots; speedups over the ar run")
    p.add_argument("runs", nargs="+", help="directories written by `bebop rl`")
    p.add_argument("--out", default=None, help="output directory (default: the first run's parent)/report")
    p.set_defaults(func="rl:cmd_report")
    return parser
