"""The documentation of DashConfig cannot rot: every field is documented, with its real default.

Two places document the fields: the ``DashConfig`` class docstring (``help(DashConfig)``) and
the field tables of docs/ALGORITHM.md section 9. For every field of
``dataclasses.fields(DashConfig)``:

- the docstring names it as ``name`` (double backticks, reST literal);
- section 9 has exactly one table row whose first cell is `name`, and whose second cell, the
  default, equals the real default.

Defaults are compared in a normalised form: the cell's text with its backticks stripped is read
by ``ast.literal_eval`` (so ``"auto"`` and ``'auto'``, ``1e-06`` and ``0.000001`` are equal), and
must equal the dataclass default *and have its type* (so ``0`` does not pass for ``0.0``, nor
``1`` for ``True``). ``math.inf`` is written ``math.inf`` and compared as ``float("inf")``.

Section numbers that the code cites ("docs/ALGORITHM.md 5.3") must exist as headings or bold
subsection labels.
"""

import ast
import builtins
import dataclasses
import inspect
import math
import re
from pathlib import Path

import pytest

from dash_fn import DashConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "ALGORITHM.md"
FIELDS = [f.name for f in dataclasses.fields(DashConfig)]


def section(text: str, number: int) -> str:
    """The body of ``## <number>. ...`` up to the next level-2 heading."""
    match = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", text, flags=re.M | re.S)
    assert match, f"docs/ALGORITHM.md has no section {number}"
    return match.group(0)


def field_rows(text: str) -> dict[str, list[list[str]]]:
    """Table rows of section 9 whose first cell is a backticked name: name -> [cells, ...]."""
    rows: dict[str, list[list[str]]] = {}
    for line in section(text, 9).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # "\|" stays in its cell
        name = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0])
        if name:
            rows.setdefault(name.group(1), []).append(cells)
    return rows


def parse_default(cell: str):
    text = cell.strip().strip("`").strip()
    if text == "math.inf":
        return math.inf
    return ast.literal_eval(text)


def default_of(name: str):
    field = next(f for f in dataclasses.fields(DashConfig) if f.name == name)
    assert field.default is not dataclasses.MISSING, f"DashConfig.{name} has no plain default"
    return field.default


@pytest.mark.parametrize("name", FIELDS)
def test_field_is_in_the_docstring(name):
    assert f"``{name}``" in DashConfig.__doc__, f"DashConfig's docstring does not document {name}"


@pytest.mark.parametrize("name", FIELDS)
def test_field_is_in_the_table_with_its_default(name):
    rows = field_rows(DOC.read_text(encoding="utf-8"))
    assert name in rows, f"docs/ALGORITHM.md section 9 has no table row for {name}"
    assert len(rows[name]) == 1, f"docs/ALGORITHM.md section 9 has {len(rows[name])} rows for {name}"
    cells = rows[name][0]
    assert len(cells) == 4 and all(cells), f"row of {name} must have field, default, allowed and effect: {cells}"
    documented, real = parse_default(cells[1]), default_of(name)
    assert type(documented) is type(real) and documented == real, (
        f"docs/ALGORITHM.md gives {name} the default {cells[1]}, the code {real!r}"
    )


def test_table_documents_no_field_that_does_not_exist():
    rows = field_rows(DOC.read_text(encoding="utf-8"))
    assert sorted(set(rows) - set(FIELDS)) == []


def test_cited_sections_exist():
    """Every "docs/ALGORITHM.md N" or "N.M" cited in the package, tests, benchmarks and
    examples names a section heading (``## N.``) or a bold subsection label (``**N.M ``)."""
    text = DOC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (\d+)\. ", text, flags=re.M))
    labels = set(re.findall(r"\*\*(\d+\.\d+) ", text))
    root = DOC.parent.parent
    cited = set()
    for folder in ("dash_fn", "tests", "benchmarks", "examples"):
        for path in (root / folder).rglob("*.py"):
            for match in re.finditer(
                r"docs/ALGORITHM\.md,? (?:sections? )?(\d+(?:\.\d+)?)", path.read_text(encoding="utf-8")
            ):
                cited.add((match.group(1), str(path.relative_to(root))))
    assert cited, "no citation found: the pattern is stale"
    missing = [(n, where) for n, where in sorted(cited) if (n not in labels if "." in n else n not in headings)]
    assert not missing, missing


def public_callables() -> dict[str, object]:
    """What the API reference (docs/api.md) renders: ``dash_fn.__all__``, ``dash_fn.utils.__all__``,
    ``dash_fn.preconditioners.fields_read``, and the public methods of ``DASH``, ``DashConfig``
    and ``Preconditioner`` that those classes define."""
    import dash_fn
    import dash_fn.utils
    from dash_fn.preconditioners import Preconditioner, fields_read

    objects = {f"dash_fn.{n}": getattr(dash_fn, n) for n in dash_fn.__all__ if n != "utils"}
    objects |= {f"dash_fn.utils.{n}": getattr(dash_fn.utils, n) for n in dash_fn.utils.__all__}
    objects["dash_fn.preconditioners.fields_read"] = fields_read
    for cls in (dash_fn.DASH, dash_fn.DashConfig, Preconditioner):
        for name, member in vars(cls).items():
            member = getattr(member, "__func__", member)  # classmethods
            if not name.startswith("_") and inspect.isfunction(member):
                objects[f"dash_fn.{cls.__name__}.{name}"] = member
    return objects


def sections(doc: str) -> dict[str, list[str]]:
    """A Google-style docstring's sections: title -> the names its entries start with."""
    found: dict[str, list[str]] = {}
    title = None
    for line in doc.splitlines():
        heading = re.fullmatch(r"(Args|Returns|Raises):", line)
        if heading:
            title = heading.group(1)
            found[title] = []
        elif title and re.match(r"^    \S", line):
            entry = re.match(r"^    (\*{0,2}\w+)(?: \([^)]*\))?:", line)
            found[title].append(entry.group(1) if entry else line.strip())
        elif line and not line.startswith(" "):
            title = None
    return found


PUBLIC = public_callables()


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_documents_its_arguments_returns_and_raises(name):
    """The API reference renders these sections (mkdocstrings, Google style); ``make docs``
    fails on an entry that names no parameter, and this fails on a parameter without one."""
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    assert not re.search(r":(?:func|mod|class|meth|attr):`", doc), f"{name}: a Sphinx role, which the site shows raw"
    if name == "dash_fn.DashConfig":
        return  # its fields are its arguments: test_field_is_in_the_docstring
    found = sections(doc)
    params = [
        ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
        for p in inspect.signature(obj).parameters.values()
        if p.name not in ("self", "cls")
    ]
    assert found.get("Args", []) == params, f"{name}: Args documents {found.get('Args')}, the signature has {params}"
    returns = inspect.signature(obj).return_annotation
    if not inspect.isclass(obj) and returns not in (None, "None"):
        assert found.get("Returns"), f"{name} returns a value: its docstring needs a Returns section"
    for raised in found.get("Raises", []):
        assert isinstance(getattr(builtins, raised, None), type), f"{name}: Raises names {raised!r}, not an exception"
