"""The README's and the docs' code runs as written, and every script's --help shows each default once.

Each ```python block of README.md and of the Markdown pages under docs/ runs as a script of its
own in a fresh subprocess, in a temporary directory (blocks write checkpoints). A block may be
exempted only by the comment ``<!-- not run: REASON -->`` on the line right before its opening
fence, and at most two may be in the README and one a page of docs. Blocks that use
torch.distributed start a one-process gloo group (MASTER_ADDR and MASTER_PORT from the
environment, which the test sets to a free port). The README's "Quick start" blocks print their
loss, which must fall.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->$")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def markdown_blocks(path: Path) -> list[dict]:
    """Every ```python block of a page: its file, first line number, code, level-2 section,
    heading and not-run reason (or None)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, section, heading, i = [], "", "", 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^#{1,6} ", line):
            heading = line.lstrip("#").strip()
            if line.startswith("## "):
                section = heading
        if line.startswith("```"):  # a fence: find its end, keep it if it is python
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            if line.strip() == "```python":
                marker = NOT_RUN.match(lines[i - 1].strip()) if i else None
                blocks.append(
                    {
                        "file": str(path.relative_to(ROOT)),
                        "line": i + 2,
                        "code": "\n".join(lines[i + 1 : end]) + "\n",
                        "section": section,
                        "heading": heading,
                        "not_run": marker["reason"] if marker else None,
                    }
                )
            i = end
        i += 1
    return blocks


BLOCKS = [block for page in PAGES for block in markdown_blocks(page)]
README = [b for b in BLOCKS if b["file"] == "README.md"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pages_have_python_blocks_and_few_exceptions():
    assert len(README) >= 3, "README.md's python blocks were not found"
    assert len([b for b in README if b["section"] == "Quick start" and not b["not_run"]]) == 3
    exempt = [b for b in BLOCKS if b["not_run"] is not None]
    assert all(b["not_run"] for b in exempt), "a not-run marker must say why"
    assert len([b for b in exempt if b["file"] == "README.md"]) <= 2
    for page in {b["file"] for b in exempt if b["file"] != "README.md"}:
        assert len([b for b in exempt if b["file"] == page]) <= 1, f"{page}: at most one block may be marked not run"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b["not_run"] is None], ids=lambda b: f"{b['file']}:{b['line']}")
def test_block_runs(block, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block["code"])
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    where = f"{block['file']} block at line {block['line']} ({block['heading']})"
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-3000:]}"
    if block["file"] == "README.md" and block["section"] == "Quick start":  # it prints the loss going down
        losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", result.stdout)]
        assert len(losses) >= 3, result.stdout
        assert losses[-1] < 0.5 * losses[0], f"{where}: {result.stdout}"


def argparse_scripts() -> list[Path]:
    scripts = sorted([*ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/*.py")])  # not the studies: kept as they ran
    return [p for p in scripts if not p.name.startswith("test_") and "argparse.ArgumentParser" in p.read_text()]


def module_of(path: Path) -> str:
    """The module a script runs as (``python -m``), from the checkout's root: examples.train_lm."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


HELP_OF_EACH = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    text, code = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        code = "raised"
        text.write(traceback.format_exc())
    results[module] = [code, text.getvalue()]
sys.__stdout__.write(json.dumps(results))
"""


def option_entries(help_text: str) -> list[str]:
    """The entries of the options section of an argparse --help, each joined onto one line."""
    lines = help_text.splitlines()
    start = lines.index("options:") + 1
    entries = []
    for line in lines[start:]:
        if not line.strip():
            break  # the section ends at a blank line (an epilog may follow)
        if re.match(r"^  -", line):
            entries.append(line.strip())
        else:
            entries[-1] += " " + line.strip()
    return entries


def test_every_script_help_shows_each_default_once():
    """`--help` of every example and benchmark script exits 0, and each option names its
    default exactly once: ArgumentDefaultsHelpFormatter's "(default: X)" and no other
    "default" (a hand-written one would repeat it, or contradict it)."""
    scripts = argparse_scripts()
    names = {p.name for p in scripts}
    assert {
        "train_lm.py",
        "quickstart.py",
        "cnn_digits.py",
        "compiled_step.py",
        "ddp_train.py",
        "step_bench.py",
    } <= names, names

    # one interpreter for all of them (torch is imported once), started in the checkout's root
    # where the examples and benchmarks packages are: runpy runs each module as __main__ with
    # argv [module, --help]; argparse prints the help and raises SystemExit(0)
    result = subprocess.run(
        [sys.executable, "-c", HELP_OF_EACH, *map(module_of, scripts)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads(result.stdout)
    problems = []
    for path in scripts:
        name = path.relative_to(ROOT)
        code, text = results[module_of(path)]
        if code != 0:
            problems.append(f"{name} --help exited {code!r}: {text[-500:]}")
            continue
        for entry in option_entries(text):
            if entry.startswith("-h, --help"):
                continue
            if entry.count("(default:") != 1 or len(re.findall(r"\bdefault\b", entry, re.IGNORECASE)) != 1:
                problems.append(f"{name}: {entry}")
    assert not problems, "each option must show its default exactly once:\n" + "\n".join(problems)


def test_snippets_use_the_block_size_the_configuration_guide_advises():
    """docs/guide/configuration.md advises against blocks of 1024 for thin weights: no snippet
    that users copy passes ``block_size=1024`` (``DashConfig.paper()`` is the named way to get it)."""
    assert not [f"{b['file']}:{b['line']}" for b in BLOCKS if "block_size=1024" in b["code"]]
