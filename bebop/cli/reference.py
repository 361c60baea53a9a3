"""docs/reference/cli.md from the parser: every command and option with its default and help.

    python -m bebop.cli.reference > docs/reference/cli.md
"""

import argparse

from bebop.cli.parser import DESCRIPTION, build_parser

REGENERATE = "python -m bebop.cli.reference > docs/reference/cli.md"


def leaf_commands(parser, prefix="bebop"):
    """(full command name, parser, one-line help) for every command, `analyze entropy` included."""
    sub = parser._subparsers._group_actions[0]
    helps = {a.dest.split(" (")[0]: a.help for a in sub._choices_actions}  # "name (alias)" when aliased
    seen = set()  # an alias names the same parser again: its command is listed once, under its own name
    for name, p in sub.choices.items():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p._subparsers is None:
            yield f"{prefix} {name}", p, helps.get(name, "")
        else:
            yield from leaf_commands(p, f"{prefix} {name}")


def option_row(action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    default = "required" if action.required else (
        "" if action.default in (None, argparse.SUPPRESS) or action.default is False else f"`{action.default}`")
    text = (action.help or "").replace("%(default)s", str(action.default)).replace("|", "\\|").replace("\n", " ")
    return f"| {names} | {default} | {text} |"


def reference() -> str:
    lines = ["# bebop command line reference", "", f"Generated from the parser; regenerate with `{REGENERATE}`.",
             "", DESCRIPTION.strip(), ""]
    for name, p, summary in leaf_commands(build_parser()):
        lines += [f"## {name}", "", summary, "", "| option | default | help |", "| --- | --- | --- |"]
        lines += [option_row(a) for a in p._actions if a.help != argparse.SUPPRESS and a.dest != "help"]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
