"""The walls around benchmarks/ and examples/, read from the files (parsed, never imported or run).

- No file under benchmarks/ or examples/ edits ``sys.path``: the tools run as modules
  (``python -m benchmarks.peers``) from the checkout's root, and the examples that import a
  sibling as ``python -m examples.NAME``; tests get both packages from pytest's ``pythonpath``.
- Tests import tools, never the reverse: no module of the benchmarks or examples packages
  imports a module of tests/, and the examples import nothing of benchmarks/.
- No test imports (or launches) a study of benchmarks/studies/: studies are kept as they ran.
- The benchmarks and examples packages have no import cycle, function-local imports included.
- RESULTS.md is a page of current figures (at most 300 lines), and every Markdown link into
  benchmarks/ from the README, docs/ and the changelog, and every section of RESULTS.md that a
  page or a comment names ("RESULTS.md, "Update rules""), exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from benchmarks.code_shape import cycles  # Tarjan's components, as the package's shape report finds them

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("benchmarks", "examples")
TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"tests"}
RESULTS_LINES = 300


def python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for folder in PACKAGES for p in python_files(folder)}


def imported(path: Path) -> list[str]:
    """Every module a file imports, function-local imports included, absolute names resolved:
    ``from benchmarks import peers`` gives ``benchmarks.peers`` when that is a module."""
    names = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package upwards
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return names


def sys_path_edits(path: Path) -> list[str]:
    """Where a file touches ``sys.path`` (an edit, or code in a string that edits it), as line numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "sys.path" in node.value:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} (in a string)")
    return found


def test_no_file_under_benchmarks_or_examples_edits_sys_path():
    edits = [where for folder in PACKAGES for path in python_files(folder) for where in sys_path_edits(path)]
    assert not edits, "run tools as modules from the checkout's root instead of editing sys.path:\n" + "\n".join(edits)


def test_the_packages_import_nothing_from_tests():
    wrong = [
        f"{module} imports {name}"
        for module, path in MODULES.items()
        for name in imported(path)
        if name.split(".")[0] in TEST_MODULES
    ]
    wrong += [
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if module.split(".")[0] == "examples"
        for name in imported(path)
        if name.split(".")[0] == "benchmarks"
    ]
    assert not wrong, "tests import tools, never the reverse (and the examples stand alone):\n" + "\n".join(wrong)


def test_no_test_imports_or_launches_a_study():
    wrong = []
    for path in python_files("tests"):
        if path.name == "test_layout.py":
            continue  # this file names the folder to check it
        names = imported(path)
        strings = [
            node.value
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
        wrong += [f"{path.name} imports {n}" for n in names if n.startswith("benchmarks.studies")]
        wrong += [f"{path.name} names {s!r}" for s in strings if re.search(r"benchmarks[./]studies\b", s)]
    assert not wrong, "studies are kept as they ran; a test of one makes it a tool (move it out):\n" + "\n".join(wrong)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. A package's ``__init__`` is left out as a
    target: importing ``benchmarks.peers`` runs ``benchmarks/__init__.py``, which imports nothing."""
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for name in imported(path):
            while name and name not in MODULES:
                name = name.rpartition(".")[0]  # benchmarks.peers.make_model -> benchmarks.peers
            if name and name != module and path.name != "__init__.py" and not MODULES[name].name == "__init__.py":
                targets.add(name)
        graph[module] = targets
    return graph


def test_the_packages_have_no_import_cycle():
    inits = [p for folder in PACKAGES for p in (ROOT / folder).rglob("__init__.py")]
    assert all(p.read_text() == "" for p in inits), (
        "the packages' __init__ files stay empty (a cycle through them is not in the graph)"
    )
    graph = import_graph()
    assert not cycles(graph, graph), cycles(graph, graph)


def test_the_cycle_check_sees_a_cycle():
    """The check itself, on a made-up graph: a -> b -> c -> a is a cycle, e -> a is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "e": {"a"}}
    assert cycles(graph, graph) == [["a", "b", "c"]]


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # no headings inside code blocks
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}


LINKING_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
BENCHMARK_PAGES = sorted((ROOT / "benchmarks").rglob("*.md"))


@pytest.mark.parametrize("page", [*LINKING_PAGES, *BENCHMARK_PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_benchmarks_resolve(page):
    """Every relative Markdown link from this page to a page under benchmarks/ (or, from a page
    under benchmarks/, to any local page) names a file that exists and, with ``#``, one of its
    headings."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if "benchmarks" not in resolved.relative_to(ROOT).parts and page not in BENCHMARK_PAGES:
            continue
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def test_results_is_a_page_of_current_figures():
    lines = RESULTS.read_text(encoding="utf-8").count("\n")
    assert lines <= RESULTS_LINES, f"RESULTS.md has {lines} lines; dated logs go to benchmarks/history/"


def cited_sections() -> list[tuple[str, str]]:
    """(where, name) of each section of RESULTS cited by name: ``benchmarks/RESULTS.md, "Update
    rules"``, ``RESULTS "Staggered refresh"``, ``RESULTS, [The first hour](...)`` in the package,
    tests, tools, examples and pages."""
    files = [*LINKING_PAGES, *(p for folder in ("dash_fn", "tests", *PACKAGES) for p in python_files(folder))]
    pattern = re.compile(r"RESULTS(?:\.md)?(?:,|\s)\s*\(?(?:sections?\s+)?\"([^\"]+)\"")
    found = []
    for path in files:
        if path.name == "test_layout.py":
            continue
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))  # comments' lines joined
        found += [(str(path.relative_to(ROOT)), m.group(1)) for m in pattern.finditer(text)]
    return found


def test_sections_cited_by_name_exist():
    assert cited_sections(), "no citation found: the pattern is stale"
    headings = [
        re.sub(r"\s+", " ", h)
        for h in re.findall(r"^#{1,6} (.+?)\s*$", RESULTS.read_text(encoding="utf-8"), flags=re.M)
    ]
    missing = [(where, name) for where, name in cited_sections() if not any(h.startswith(name) for h in headings)]
    assert not missing, missing
