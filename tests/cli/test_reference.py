"""docs/reference/cli.md is what `python -m bebop.cli.reference` writes now."""

from pathlib import Path

from bebop.cli.reference import REGENERATE, reference

DOC = Path(__file__).parents[2] / "docs" / "reference" / "cli.md"


def test_committed_reference_matches_the_parser():
    assert DOC.read_text() == reference(), f"docs/reference/cli.md is stale: run `{REGENERATE}`"


def test_reference_lists_every_command_and_new_option():
    text = reference()
    for heading in ("## bebop generate", "## bebop rl", "## bebop analyze entropy", "## bebop report"):
        assert heading in text
    assert "| `--learning-rate` |" in text and "| `--draft` |" in text
    assert "`--lr`" not in text  # deprecated aliases stay out of the reference
