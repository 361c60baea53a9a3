"""The package's shape, checked from its source: data flows one way through the stages, no import circle (function-level
imports count), no function a reader cannot hold in one screen, few loose modules, no notebook leftovers."""

import ast
import functools
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bebop"

# lower stages never import higher ones; a module may import its own stage and any below
STAGES = [
    ("errors", "io", "seeds", "sampling", "tasks"),
    ("models",),
    ("drafts",),
    ("engine",),
    ("backends",),
    ("training",),
    ("rl",),
    ("studies",),
    ("integrations",),
    ("cli",),
]
MAX_FUNCTION_LINES = 80
DECLARATIVE = re.compile(r"^(build_parser|add_\w+_args)$")  # argument parsers: a list of flags, read as a table
MAX_LOOSE_MODULES = 6


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def trees() -> dict[Path, ast.Module]:
    """Every module's syntax tree, parsed in a fresh interpreter: late in a full test run, Python 3.11's
    `ast.parse` once failed in this process with "AST constructor recursion depth mismatch" on a file it parses
    fine elsewhere (recursion bookkeeping left by earlier tests)."""
    paths = [str(p) for p in sources().values()]
    parse = "import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps([ast.parse(open(p).read()) for p in sys.argv[1:]]))"
    out = subprocess.run([sys.executable, "-c", parse, *paths], capture_output=True, check=True).stdout
    return dict(zip(map(Path, paths), pickle.loads(out)))


def stage(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for level, names in enumerate(STAGES):
        if top in names:
            return level
    raise AssertionError(f"{module}: not in any stage of STAGES (add its folder there)")


def imports(path: Path, modules: set[str]) -> set[str]:
    """The bebop modules `path` imports anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(trees()[path]):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("bebop.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bebop") and not node.level:
            for a in node.names:  # `from bebop.x import y`: the module bebop.x.y if it is one, else bebop.x
                found.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    src = sources()
    modules = set(src)
    return {m: imports(p, modules) - {m} for m, p in src.items() if m != "bebop"}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_import_from_a_lower_stage_to_a_higher_one():
    upward = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps if stage(d) > stage(m))
    assert not upward, "\n".join(upward)


def test_no_function_longer_than_a_screen():
    long = []
    for module, path in sources().items():
        for node in ast.walk(trees()[path]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not DECLARATIVE.match(node.name):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_few_loose_modules():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose


LEFTOVERS = re.compile(r"NOTES\.md|\b[Ii]ssue[- ]?#?\d+|\b[Ss]ession \d+")


def test_no_issue_or_session_numbers_or_private_notes_in_the_package():
    found = [f"{module_name(p)}:{i}: {line.strip()[:80]}" for p in PACKAGE.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if LEFTOVERS.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_circle_finder_finds_circles(graph, expected):
    assert circles(graph) == expected


def test_the_tracked_files_leave_the_gpu_check_room_for_the_model():
    """Every device call of the GPU check carries the tracked files (examples/gpu/prepare.sh): they must leave
    room for the default model's GGUF to go over in the calls the script allows. A bulky file added to git
    (fp32 drafts, per-token traces) fails here, not on the one session that is lent a GPU."""
    from bebop.models.registry import smollm2_gguf

    root = PACKAGE.parent
    script = (root / "examples" / "gpu" / "prepare.sh").read_text()
    limit, margin, calls = (int(re.search(rf"{name}=(?:\$\{{\w+:-)?(\d+)", script).group(1))
                            for name in ("LIMIT_MIB", "MARGIN_MIB", "MAX_CALLS"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    size = sum((root / p).stat().st_size for p in tracked.decode().split("\0") if p and (root / p).is_file())
    model = (Path(smollm2_gguf()[0]) / smollm2_gguf()[1]).stat().st_size
    room = (limit - margin - 1) * 2 ** 20 - size  # (1 MiB for the gguf wheel and the checksum)
    assert room * calls >= model, f"tracked files {size / 2 ** 20:.1f} MiB leave {room / 2 ** 20:.1f} MiB a call"


def test_the_gpu_checks_step_limits_fit_the_call_that_runs_it():
    """examples/gpu/check.sh gives each step its own time limit; together they must end inside the timeout of
    the device call prepare.sh prints for it (with room for the setup before them), or the last steps are cut."""
    gpu = PACKAGE.parent / "examples" / "gpu"
    check = (gpu / "check.sh").read_text()
    bench = int(re.search(r"else\n\s+BATCHES=.*BENCH_T=(\d+)", check).group(1))  # the full check's, not the dry run's
    limits = [int(x) for x in re.findall(r"^\s*step \w+ (\d+) ", check, re.MULTILINE)]  # (not the rl steps)
    rl = re.search(r'for rollout in ((?:\w+ ?)+); do\n\s+step "rl-\$rollout" (\d+) ', check)
    total = sum(limits) + bench + len(rl.group(1).split()) * int(rl.group(2))
    call = int(re.search(r"echo 60 \|\| echo (\d+)", (gpu / "prepare.sh").read_text()).group(1))
    assert len(limits) == 5 and total + 15 <= call, (limits, bench, total, call)
