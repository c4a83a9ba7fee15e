"""The documentation keeps its promises (issue 33): a short README, docs/ pages that build strictly, a test named
beside every "exact", "never", "always", "within X" and "same as", and one version in --version, pyproject and CHANGELOG."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))  # a page in a sub-folder is held too
TEXTS = [ROOT / "README.md", *PAGES]
LINKED = [ROOT / "README.md", ROOT / "CHANGELOG.md"]  # read on GitHub: mkdocs does not check their links

HELD_BY = re.compile(r"tests/([\w/]+\.py)::(\w+)")
CLAIM = re.compile(r"\b(exact|exactly|never|always|within\s+(?:[±~]\s*)?[0-9][0-9.,]*\s*(?:%|ms|s\b|sessions|x)?"
                   r"|within\s+(?:(?:a|an|one|two|three|a\s+few|half\s+a)\s+)?(?:milliseconds?|seconds?|minutes?)\b"
                   r"|same\s+as|identical|guarantee[sd]?\b)", re.I)  # "same as": DEVELOPERS.md's rule
NEAR = 600  # a claim's test is named in the same paragraph, list item or table row, at most this far after it

# Words used in a sense that claims nothing a test could hold, each with the reason.
NOT_A_CLAIM: dict[tuple[str, str], str] = {
    ("README.md", "this is exactly what CI runs"): "held by test_the_readmes_test_command_is_what_ci_runs below",
    ("install.md", "this is exactly what CI runs"): "held by test_the_readmes_test_command_is_what_ci_runs below",
    ("differences.md", "computes the key but never stores anything"): "about the reference tool, not this one",
    ("differences.md", "retrieval keys never match the ingested"): "about the reference tool, not this one",
    ("differences.md", "offered load never changes"): "about the reference tool, not this one",
    ("differences.md", "a guaranteed miss with no I/O"): "about the reference tool, not this one",
    ("performance.md", "run by hand, never in CI"): "how the benchmark scripts are run, not a property of the code",
    ("sessions.md", "four runs exactly (NVIDIA"): "a property of a fitted constant against published profiles, "
                                               "quoted with the sources in kv_cache/specs/calibration.yaml",
    ("sessions.md", "profile exactly is the constant"): "a definition (the efficiency that reproduces a profile)",
}
PENDING: dict[tuple[str, str], str] = {}  # claims not yet matched to a test: none may be added


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (a word in code is a name or a value, not a claim)."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"`[^`]{0,400}`", lambda m: re.sub(r"\S", " ", m.group(0)), text)


def _units(text: str) -> list[str]:
    """Paragraphs, list items and table rows: the unit a claim and its test share."""
    units: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        current: list[str] = []
        for line in para.split("\n"):
            starts = line.startswith("|") or re.match(r"^\s{0,3}(?:[-*]|\d+\.)\s", line)
            if starts and current:
                units.append("\n".join(current))
                current = []
            current.append(line)
            if line.startswith("|"):
                units.append("\n".join(current))
                current = []
        if current:
            units.append("\n".join(current))
    return units


@functools.cache
def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return {n for n in names if n.startswith("test")}


def _claims_without_a_test(name: str, text: str) -> list[str]:
    missing = []
    for unit in _units(_prose(text)):
        flat = " ".join(unit.split())
        for m in CLAIM.finditer(flat):
            context = flat[max(0, m.start() - 60):m.end() + 60]
            if any(page == name and phrase in flat for (page, phrase) in {**NOT_A_CLAIM, **PENDING}):
                hit = [phrase for (page, phrase) in {**NOT_A_CLAIM, **PENDING} if page == name and phrase in flat]
                if any(flat.find(p) <= m.start() < flat.find(p) + len(p) for p in hit):
                    continue
            if not HELD_BY.search(flat[m.end():m.end() + NEAR]) and not HELD_BY.search(
                    flat[flat.rfind(". ", 0, m.start()) + 1:m.start()]):
                missing.append(f"{name}: ...{context}...")
    return missing


def test_the_readme_is_short_and_every_page_under_400_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    long = {p.name: n for p in PAGES if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


@pytest.mark.parametrize("path", [*TEXTS, ROOT / "CHANGELOG.md"], ids=lambda p: p.name)
def test_every_named_test_exists(path):
    for file, func in HELD_BY.findall(path.read_text()):
        target = ROOT / "tests" / file
        assert target.is_file(), f"{path.name} names tests/{file}, which does not exist"
        assert func in _test_names(target), f"{path.name} names tests/{file}::{func}, which does not exist"


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_every_exact_never_always_and_within_names_its_test(path):
    missing = _claims_without_a_test(path.name, path.read_text())
    assert not missing, "\n".join(missing)


def test_the_claim_check_catches_a_claim_without_a_test_and_passes_one_with():
    """Adversarial: the check above is not vacuous."""
    assert _claims_without_a_test("x.md", "The window never grows.\n")
    assert _claims_without_a_test("x.md", "| a | within 3 % of the kernel |\n")
    assert _claims_without_a_test("x.md", "Rates are exact.\n\nAnother paragraph (held by tests/test_docs.py::a).\n")
    assert not _claims_without_a_test("x.md", "The window never grows (held by tests/test_docs.py::test_x).\n")
    assert not _claims_without_a_test("x.md", "Its `method` is `exact (the union)`.\n")  # a value in code
    assert not _claims_without_a_test("x.md", "```\nnever in code\n```\n")
    assert not _claims_without_a_test("README.md", "- this is exactly what CI runs\n")  # allow-listed
    assert _claims_without_a_test("x.md", "The others stop within half a second.\n")  # spelled out
    assert _claims_without_a_test("x.md", "The others stop within seconds.\n")
    assert _claims_without_a_test("x.md", "Percentiles agree within ±1 %.\n")
    assert _claims_without_a_test("x.md", "NEVER and Always are claims too.\n")
    assert not _claims_without_a_test("x.md", "averaged within a trial\n")  # not a bound
    assert _claims_without_a_test("x.md", "Its figures are the same as the reference's.\n")
    assert _claims_without_a_test("x.md", "The bytes are identical.\n")
    assert HELD_BY.findall("tests/test_docs.py::test_x") == [("test_docs.py", "test_x")]


def _broken_links(path: Path) -> list[str]:
    """Relative links of a markdown file (outside code) whose file, or whose heading anchor, is not there."""
    broken = []
    for link in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", path.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (path.parent / file) if file else path
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+\s+(.*?)\s*$", target.read_text(), re.M)}
            if anchor not in slugs:
                broken.append(link)
    return broken


@pytest.mark.parametrize("path", LINKED, ids=lambda p: p.name)
def test_the_readmes_and_changelogs_links_resolve(path, tmp_path):
    assert not _broken_links(path), _broken_links(path)
    bad = tmp_path / "README.md"  # adversarial: a page that is gone and a heading that is not there
    bad.write_text("[a](docs/gone.md) [b](#no-heading) [c](https://example.com/x) [d](#set-up)\n\n## Set-up\n")
    assert _broken_links(bad) == ["docs/gone.md", "#no-heading"]


def test_the_readmes_test_command_is_what_ci_runs():
    command = 'python3 -m pip install -e ".[dev]" && python3 -m pytest'
    assert command in (ROOT / "README.md").read_text()
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == command


def test_the_quick_start_writes_into_the_ignored_results_folder():
    readme = (ROOT / "README.md").read_text()
    quick = next(line for line in readme.splitlines() if line.startswith("python3 -m pip install -e . && kv-cache"))
    assert "--output results/" in quick and "--duration 30" in quick
    assert "/results/" in (ROOT / ".gitignore").read_text().split()  # the root's only: not kv_cache/results/


def test_a_run_without_output_writes_a_name_gitignore_lists():
    """Issue 33.5: without --output, a run and `kv-cache sessions` write <default>_<time>.json in the working
    directory (as the reference does); .gitignore lists both, so a run from the checkout leaves nothing to commit."""
    import fnmatch
    from datetime import datetime

    from kv_cache.cli.sessions import SessionsFlags, timestamped
    from kv_cache.settings.run import OutputSettings

    ignored = (ROOT / ".gitignore").read_text().split()
    for default in (OutputSettings().output, SessionsFlags().output):
        name = timestamped(default, datetime(2026, 12, 2, 4, 5, 6))
        assert any(fnmatch.fnmatch(name, pattern) for pattern in ignored), (name, ignored)


def _changelog_version() -> str:
    top = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    return top.split()[1]


def test_version_pyproject_and_changelog_agree():
    """One source: kv_cache.__version__, which pyproject reads; --version prints it; CHANGELOG's top entry is it."""
    import kv_cache

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kv_cache.__version__"}
    init = ast.parse((ROOT / "kv_cache" / "__init__.py").read_text())
    static = next(n.value.value for n in init.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "__version__")
    assert static == kv_cache.__version__ == _changelog_version()
    out = subprocess.run([sys.executable, str(ROOT / "kv-cache.py"), "--version"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == f"kv-cache {_changelog_version()}"


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # no -q: mkdocs 1.6 counts the warnings that --strict turns into a failure only at the levels it logs, so
    # `build --strict -q` ends 0 with a broken link (the adversarial half of the test below caught it)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d",
                           str(site)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[dev]')")


@needs_mkdocs
def test_the_docs_build_strictly_and_a_broken_link_fails_them(tmp_path):
    ok = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "faults" / "index.html").is_file()
    copy = tmp_path / "copy"  # adversarial: the same docs with one link to a page that is not there
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "faults.md").open("a") as f:
        f.write("\nSee [a page that is gone](no-such-page.md).\n")
    broken = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site2")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr


def test_version_needs_none_of_the_dependencies(capsys):
    """`kv-cache --version` answers before the missing-dependency guard imports the CLI: the same line as the
    CLI's own --version, so a checkout without numpy still says which version it is."""
    from kv_cache import launcher

    assert launcher.main(["--version"]) == 0
    assert capsys.readouterr().out == f"kv-cache {_changelog_version()}\n"
    assert launcher.wrapper_main(["--version"]) == 0  # mlperf_wrapper.py --version: the same line, not exit 2
    assert capsys.readouterr().out == f"kv-cache {_changelog_version()}\n"
