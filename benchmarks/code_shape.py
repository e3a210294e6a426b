"""The package's shape: import graph, cycles, lines per module, largest functions, device reads.

    python -m benchmarks.code_shape [ROOT]    # ROOT: a checkout (default: this one)

Arrows are the imports of ``dash_fn`` modules by ``dash_fn`` modules, function-level ones
included; importing a submodule runs its package's ``__init__``, so that is an arrow too.
"Device reads" counts, outside ``strategy.py``, the places that read the execution strategy or
derive it from a device: ``host_reads``, ``cpu_ops``, ``for_device(``, ``is_compiling(``.
"Mode-string tests" counts, outside ``config.py``, the comparisons (``==``, ``!=``, ``in``) of a
value with a string literal (or a tuple of them) that is one of DashConfig's choices
(:data:`CHOICES`), leaving out lookups of a key (``"adamw" in state.keys()``).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections import defaultdict

READS = re.compile(r"\bhost_reads\b|\bcpu_ops\b|for_device\(|is_compiling\(")
# the values of DashConfig's choice fields (solver, preconditioner, scaling, eigh_heuristic,
# grafting, one_dim, refresh_schedule, precision, fsdp_blocks), as of issue 68
CHOICES = set(
    "eigh cn ndb chebyshev qr auto shampoo eigenvalue_corrected fro pi pim abs abs_add relu adam adagrad rms "
    "spectral adamw staggered periodic float32 tf32 bfloat16 float16 exact aligned local".split()
)


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return {e.value for e in node.elts}  # type: ignore[attr-defined]
    return set()


def mode_string_tests(path: str) -> int:
    """The comparisons of a value with one of :data:`CHOICES` in a module (the module doc)."""
    count = 0
    for node in ast.walk(ast.parse(open(path).read())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        keys = any(isinstance(s, ast.Call) and getattr(s.func, "attr", "") == "keys" for s in sides)
        if not keys and any(_literals(s) & CHOICES for s in sides):
            count += 1
    return count


def modules(root: str) -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(os.path.join(root, "dash_fn")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in mods.items():
        package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
        for node in ast.walk(ast.parse(open(path).read())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                base = base if node.level else (node.module or "")
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            target = next((t for t in targets if t in mods), None)
            if target and target != module:
                graph[module].add(target)
                parts = target.split(".")
                for i in range(2, len(parts)):  # a submodule's import runs its packages' __init__
                    parent = ".".join(parts[:i])
                    if parent in mods and not module.startswith(parent + ".") and parent != module:
                        graph[module].add(parent)
    return graph


def cycles(graph: dict[str, set[str]], nodes) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mods = modules(root)
    graph = imports(mods)
    short = lambda m: m.removeprefix("dash_fn.") if m != "dash_fn" else m  # noqa: E731
    print(f"cycles: {[[short(m) for m in c] for c in cycles(graph, mods)] or 'none'}")
    print("| module | lines | imports |")
    print("|---|---|---|")
    for module in sorted(mods):
        lines = sum(1 for _ in open(mods[module]))
        print(f"| {short(module)} | {lines} | {', '.join(sorted(short(t) for t in graph[module]))} |")
    functions = []
    reads = {}
    for module, path in mods.items():
        source = open(path).read()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{short(module)}.{node.name}"))
        if not module.endswith(".strategy") and READS.findall(source):
            reads[short(module)] = len(READS.findall(source))
    largest = sorted(functions, reverse=True)[:8]
    print("largest functions (lines, docstrings included): " + ", ".join(f"{name} {n}" for n, name in largest))
    print(f"device reads: {sum(reads.values())} ({', '.join(f'{m} {n}' for m, n in sorted(reads.items()))})")
    modes = {
        short(m): mode_string_tests(p) for m, p in mods.items() if not p.endswith(os.path.join("dash_fn", "config.py"))
    }
    modes = {m: n for m, n in modes.items() if n}
    listed = ", ".join(f"{m} {n}" for m, n in sorted(modes.items(), key=lambda item: -item[1]))
    print(f"mode-string tests outside config.py: {sum(modes.values())} ({listed})")


if __name__ == "__main__":
    main()
