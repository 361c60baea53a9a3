"""No option is accepted and ignored: every dest a command's parser fills is read on that command's code path."""

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap

import pytest

from bebop.cli.parser import build_parser
from bebop.rl.config import RLConfig

IGNORED = {"help", "version", "command", "study", "func"}


def commands():
    """(name, subparser) for every leaf command, `analyze entropy` included."""
    top = build_parser()._subparsers._group_actions[0].choices
    for name, sub in top.items():
        if sub._subparsers is None:
            yield name, sub
        else:
            for study, leaf in sub._subparsers._group_actions[0].choices.items():
                yield f"{name} {study}", leaf


def code_path(func, seen=None) -> str:
    """The source of `func` and of every bebop.cli function it calls, transitively."""
    seen = set() if seen is None else seen
    if func in seen:
        return ""
    seen.add(func)
    source = textwrap.dedent(inspect.getsource(func))
    for node in ast.walk(ast.parse(source)):
        name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        callee = func.__globals__.get(name) if name else None
        if inspect.isfunction(callee) and callee.__module__.startswith("bebop.cli"):
            source += code_path(callee, seen)
    if "fields(RLConfig)" in source:  # rl passes every RLConfig field by name
        source += " ".join(f"args.{f.name}" for f in dataclasses.fields(RLConfig))
    return source


@pytest.mark.parametrize("name, sub", list(commands()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_is_read(name, sub):
    module, function = sub.get_default("func").split(":")
    source = code_path(getattr(importlib.import_module(f"bebop.cli.{module}"), function))
    dests = {a.dest for a in sub._actions} - IGNORED
    unread = sorted(d for d in dests if not re.search(rf"args\.{d}\b|[\"']{d}[\"']", source))
    assert not unread, f"{name}: options parsed but never read: {unread}"
