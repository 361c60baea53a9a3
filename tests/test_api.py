"""bebop's Python API: `import bebop` lists it in __all__ without importing torch, every name resolves, the Python
defaults equal the CLI's, and every example in docs/reference/python-api.md runs as written."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bebop

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "python-api.md"

# (command, CLI option's dest, the Python default it must equal): the one place that names CLI options here
CLI_DEFAULTS = [
    ("generate", "dtype", lambda: default_of(bebop.load_model, "dtype")),
    ("generate", "mode", lambda: default_of(bebop.generate, "mode")),
    ("generate", "draft_len", lambda: default_of(bebop.generate, "draft_len")),
    ("train-draft", "autocast", lambda: bebop.TrainConfig().autocast),
]


def default_of(function, name):
    return inspect.signature(function).parameters[name].default


def subcommand_defaults(command: str) -> dict:
    from bebop.cli.parser import build_parser
    extra = ["--out", "x", "--data", "x"] if command == "train-draft" else []  # the options it requires
    return vars(build_parser().parse_args([command, *extra]))


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout


def test_import_bebop_lists_the_api_without_importing_torch():
    out = run("import sys, bebop; print(bebop.__all__); print('torch' in sys.modules)").splitlines()
    assert out[1] == "False"
    for name in ("load_model", "load_draft", "new_draft", "default_draft", "generate", "SamplingParams",
                 "TrainConfig", "train_draft", "export_eagle3", "e2e_tv_loss", "RLConfig", "run_rl", "BebopRollout",
                 "check_exactness", "SpecStats"):
        assert f"'{name}'" in out[0]


@pytest.mark.parametrize("name", bebop.__all__)
def test_every_name_in_all_resolves_and_is_documented(name):
    value = getattr(bebop, name)
    assert value is not None
    if name != "__version__":
        assert value.__doc__, name
        assert f"`{name}`" in PAGE.read_text(), f"{name} is missing from {PAGE.name}"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        bebop.no_such_thing


@pytest.mark.parametrize("command, dest, python_default", CLI_DEFAULTS, ids=[f"{c}-{d}" for c, d, _ in CLI_DEFAULTS])
def test_python_defaults_equal_the_cli_defaults(command, dest, python_default):
    assert subcommand_defaults(command)[dest] == python_default()


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_example_on_the_python_api_page_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = python_blocks()[index]
    exec(compile(code, f"{PAGE.name} block {index}", "exec"), {"__name__": "__main__"})


def test_the_page_has_examples():
    assert len(python_blocks()) >= 6


def test_generate_by_default_is_speculative_and_asks_for_a_draft_it_was_not_given():
    model, _ = bebop.load_model("tiny-llama")
    with pytest.raises(ValueError, match="needs a draft: pass draft=.*mode='ar'"):
        bebop.generate(model, [[1, 2, 3]], 4)
    out = bebop.generate(model, [[1, 2, 3]], 4, draft=bebop.new_draft(model), draft_len=2)
    assert out.stats.drafted > 0


def test_old_names_still_work_for_one_release_and_warn(monkeypatch):
    """bebop.train_mtp is train_draft; generate(mtp=) is generate(draft=) and samples the same tokens."""
    import bebop.training.train as train
    monkeypatch.setattr(train, "train_draft", lambda *args, **kwargs: ("trained", args, kwargs))
    with pytest.warns(DeprecationWarning, match="train_draft"):
        assert bebop.train_mtp("model", "data", "out", cfg=None) == ("trained", ("model", "data", "out"), {"cfg": None})
    model, _ = bebop.load_model("tiny-llama")
    draft = bebop.new_draft(model)
    new = bebop.generate(model, [[1, 2, 3]], 6, draft=draft, draft_len=2, seed=3)
    with pytest.warns(DeprecationWarning, match=r"generate\(draft=\.\.\.\)"):
        old = bebop.generate(model, [[1, 2, 3]], 6, mtp=draft, draft_len=2, seed=3)
    assert old.rollouts[0].tokens == new.rollouts[0].tokens


def test_rl_configs_old_field_names_set_the_new_ones_and_warn():
    with pytest.warns(DeprecationWarning) as warned:
        old = bebop.RLConfig(mtp="d", mtp_strategy="online-kl", mtp_learning_rate=0.5)
    assert [str(w.message).split(";")[0] for w in warned] == [
        "RLConfig(mtp=...) is now RLConfig(draft=...)", "RLConfig(mtp_strategy=...) is now RLConfig(draft_strategy=...)",
        "RLConfig(mtp_learning_rate=...) is now RLConfig(draft_learning_rate=...)"]
    assert old == bebop.RLConfig(draft="d", draft_strategy="online-kl", draft_learning_rate=0.5)
    assert "mtp_strategy" not in dataclasses.asdict(old)  # a run's config.json has the names now
