"""`bebop --help`, `--version` and every command's help: user words, defaults shown, no torch imported."""

import subprocess
import sys

import pytest

from bebop import __version__
from bebop.cli.parser import build_parser


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "bebop.cli", *argv], capture_output=True, text=True)


def test_version_prints_the_package_version():
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"bebop {__version__}"


def test_top_help_says_what_bebop_is_and_lists_commands():
    text = build_parser().format_help()
    assert "speculative decoding" in text
    for name in ("generate", "bench", "make-data", "train-draft", "rl", "report"):
        assert f"    {name}" in text


def test_help_imports_no_torch():
    code = "import sys\nfrom bebop.cli.parser import build_parser\nbuild_parser().format_help()\n" \
           "assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("command", ["generate", "bench", "rl", "train-draft", "make-data"])
def test_command_help_shows_defaults(command):
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    text = " ".join(sub.format_help().split())
    assert "--seed SEED random seed (default: 0)" in text


@pytest.mark.parametrize("argv, old, new, dest, value", [
    (["train-draft", "--data", "d", "--out", "o"], "--lr", "--learning-rate", "learning_rate", 0.5),
    (["train-draft", "--data", "d", "--out", "o"], "--arch", "--kind", "kind", "eagle3"),
    (["generate"], "--mtp", "--draft", "draft", "random"),
    (["rl", "--out", "o"], "--mtp", "--draft", "draft", "random"),
    (["rl", "--out", "o"], "--mtp-strategy", "--draft-strategy", "draft_strategy", "online-kl"),
    (["rl", "--out", "o"], "--mtp-learning-rate", "--draft-learning-rate", "draft_learning_rate", 0.5),
    (["bench"], "--json", "--output", "output", "r.json"),
    (["check-exactness"], "--samples", "--num-samples", "num_samples", 300),
    (["check-exactness"], "--tokens", "--max-new-tokens", "max_new_tokens", 5),
    (["check-exactness"], "--json", "--output", "output", "p.json"),
    (["compare-losses", "--data", "d", "--out", "o"], "--eval-samples", "--final-eval-prompts", "final_eval_prompts", 7),
    (["compare-losses", "--data", "d", "--out", "o"], "--eval-new-tokens", "--max-new-tokens", "max_new_tokens", 9),
])
def test_old_spellings_still_work_and_warn(capsys, argv, old, new, dest, value):
    parser = build_parser()
    old_args = parser.parse_args(argv + [old, str(value)])
    assert capsys.readouterr().err.strip() == f"bebop: deprecated: {old}: use {new}"
    new_args = parser.parse_args(argv + [new, str(value)])
    assert capsys.readouterr().err == ""
    assert getattr(old_args, dest) == getattr(new_args, dest) == value


def test_num_speculative_tokens_is_draft_len():
    args = build_parser().parse_args(["rl", "--out", "o", "--num-speculative-tokens", "3"])
    assert args.draft_len == 3


def test_spec_without_a_trained_draft_says_how_to_train_one(capsys):
    from bebop.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bebop: error: no trained draft for 'tiny-llama'") and "\n" not in err
    assert "bebop make-data" in err and "bebop train-draft" in err and "--draft random" in err


def test_plain_mode_needs_no_trained_draft(capsys):
    from bebop.cli import main
    main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "2", "--mode", "ar"])
    assert capsys.readouterr().out.strip()


def test_the_old_command_name_runs_the_same_command_and_warns(capsys, tmp_path):
    """`bebop train-mtp` is `bebop train-draft`, with one line saying so (here it stops at the missing data)."""
    from bebop.cli import main
    for name in ("train-mtp", "train-draft"):
        with pytest.raises(SystemExit):
            main([name, "--model", "tiny-llama", "--data", str(tmp_path), "--out", str(tmp_path / "m")])
        err = capsys.readouterr().err
        assert "no meta.json" in err
        assert ("bebop: deprecated: train-mtp: use train-draft" in err) == (name == "train-mtp")
