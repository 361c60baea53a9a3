"""The documentation a new user meets: a README of about one screen, no private bookkeeping (issue or session
numbers) in what users read, links that resolve, result files that exist, shipped drafts named by version, and
install hints that name the distribution that installs (bebop-rl)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# pages written on other branches at the same time; linked from here, resolved once they land
PAGES_WRITTEN_ELSEWHERE = set()  # pages another change writes; none now

BOOKKEEPING = re.compile(r"\b(issue|session)s?\s?#?\d+", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RESULTS_PATH = re.compile(r"(?<![\w/.-])results/[\w+./{},*-]*[\w}*]")
# a placeholder a reader fills in: results/rl-x/B-R, results/PATH
PLACEHOLDER = re.compile(r"/[A-Z][A-Z_-]*(/|\.|$)")
PIP_INSTALL_BEBOP = re.compile(r"pip install '?bebop(\[|\b(?!-))")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def user_facing_text() -> list[Path]:
    code = [p for p in sorted((ROOT / "bebop").rglob("*.py"))]
    return [*pages(), ROOT / "CHANGELOG.md", *code]


def test_readme_fits_about_one_screen():
    assert len(README.read_text().splitlines()) <= 300


def test_docs_are_indexed():
    index = (DOCS / "README.md").read_text()
    for page in sorted(DOCS.rglob("*.md")):
        if page.name != "README.md" or page.parent != DOCS:
            assert page.relative_to(DOCS).as_posix() in index, f"docs/README.md does not link {page}"


@pytest.mark.parametrize("path", user_facing_text(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_or_session_numbers(path):
    found = [m.group(0) for m in BOOKKEEPING.finditer(path.read_text())]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_the_bookkeeping_pattern_catches_what_it_should():
    for text in ("issue 23", "Issue #7", "session 39", "sessions 12", "bench-session18-b1.json"):
        assert BOOKKEEPING.search(text), text
    for text in ("issues with the cache", "one session of training", "tissue 3"):
        assert not BOOKKEEPING.search(text), text


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, or a heading of the page itself
        resolved = (page.parent / target.split("#")[0]).resolve()
        if not resolved.exists() and resolved not in PAGES_WRITTEN_ELSEWHERE:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def expand(path: str) -> list[str]:
    """`results/a/{x,y}.json` -> both; a `*` is a glob that must match something."""
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:
        return [p for alt in brace.group(1).split(",")
                for p in expand(path[:brace.start()] + alt + path[brace.end():])]
    return [path]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_result_file_exists(page):
    missing = []
    for cited in RESULTS_PATH.findall(page.read_text()):
        if PLACEHOLDER.search(cited):
            continue
        for path in expand(cited.rstrip(".,")):
            matches = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
            # an empty folder is not in git, so a clean clone would not have it
            if not matches or not all(m.is_file() or (m.is_dir() and any(m.iterdir())) for m in matches):
                missing.append(path)
    assert not missing, f"{page.relative_to(ROOT)} cites result files that do not exist: {missing}"


def test_the_result_path_pattern_finds_paths_in_prose_and_commands():
    text = "(`results/bench/a-b.json`, from --out results/rl-x/B-R) and results/eagle3/{v1,v2}.json."
    assert RESULTS_PATH.findall(text) == ["results/bench/a-b.json", "results/rl-x/B-R", "results/eagle3/{v1,v2}.json"]
    assert expand("results/e/{a,b}.json") == ["results/e/a.json", "results/e/b.json"]
    assert PLACEHOLDER.search("results/rl-x/B-R") and PLACEHOLDER.search("results/PATH")
    assert not PLACEHOLDER.search("results/bench/bench-vs-vllm-amx-eager-seed11.json")


def test_result_file_names_carry_no_session_or_issue_numbers():
    named = [p for p in (ROOT / "results").rglob("*") if re.search(r"(session|issue)\d", p.name, re.IGNORECASE)]
    assert not named, named


def test_shipped_drafts_are_named_by_version_and_present():
    from bebop.drafts.registry import SHIPPED_DRAFTS, shipped_draft_path

    assert SHIPPED_DRAFTS, "no shipped drafts listed"
    for model, kind in SHIPPED_DRAFTS:
        path = shipped_draft_path(model, kind)
        assert re.search(r"-v\d+$", path.name), f"{path.name}: a shipped draft's name ends in its version"
        assert path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists(), path
    unlisted = {p.with_suffix("").name for p in (ROOT / "bebop" / "checkpoints").glob("*.safetensors")}
    assert unlisted == {name for name in SHIPPED_DRAFTS.values()}, "every file in bebop/checkpoints is listed"


def test_install_hints_name_the_distribution_that_installs():
    """`pip install bebop` installs an unrelated project; hints must say bebop-rl (the CLI's own messages are
    checked where the CLI is tested)."""
    texts = [*pages(), ROOT / "CHANGELOG.md", *[p for p in (ROOT / "bebop").rglob("*.py") if "cli" not in p.parts],
             *sorted((ROOT / "examples").glob("*"))]
    wrong = [str(p.relative_to(ROOT)) for p in texts if p.is_file() and PIP_INSTALL_BEBOP.search(p.read_text())]
    assert not wrong, wrong
    assert PIP_INSTALL_BEBOP.search("pip install 'bebop[vllm]'") and PIP_INSTALL_BEBOP.search("pip install bebop")
    assert not PIP_INSTALL_BEBOP.search("pip install 'bebop-rl[vllm]'")


def test_the_distribution_is_bebop_rl():
    assert re.search(r'^name = "bebop-rl"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
