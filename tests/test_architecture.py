"""The house stays as drawn: every import of a trainfit module obeys docs/architecture.md's table
(read from the document itself, so the two cannot drift apart), and the pure rooms import no torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "trainfit"
DOC = ROOT / "docs" / "architecture.md"


def allowed_imports() -> dict[str, set[str]]:
    """The import table of docs/architecture.md: package → the packages it may import."""
    rules: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        m = re.fullmatch(r"\|\s*`(\w+)`[^|]*\|(.*)\|\s*", line)
        if m:
            rules[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    assert {"job", "tune", "cli"} <= set(rules), "the import table was not found in the document"
    return rules


def _room(module: str) -> str:
    """``trainfit.tune.search`` → ``tune``; the top package's own modules → ``trainfit``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PKG / parts[1]).is_dir() else "trainfit"


def trainfit_imports() -> list[tuple[str, str, int]]:
    """(importing module, imported trainfit module, line) for every import, wherever it stands."""
    out = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        module = ".".join(parts)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(parts) - (node.level - 1) - (0 if is_pkg else 1)]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
                targets += [f"{targets[0]}.{a.name}" for a in node.names]
            for t in targets:
                if t.startswith("trainfit"):
                    out.append((module, t, node.lineno))
    return out


def test_the_import_table_holds() -> None:
    rules = allowed_imports()
    bad = []
    for src, dst, line in trainfit_imports():
        a, b = _room(src), _room(dst)
        if a == b or b == "trainfit":
            continue
        if a != "cli" and b not in rules.get(a, set()):
            bad.append(f"{src}:{line} imports {dst} ({a} → {b} is not in docs/architecture.md)")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_room_is_in_the_table() -> None:
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms <= set(allowed_imports()), rooms - set(allowed_imports())


def test_no_package_loops() -> None:
    """The table itself has no cycle (a room reaching itself through others)."""
    rules = allowed_imports()

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(rules.get(start, ()))
        while todo:
            r = todo.pop()
            if r not in seen and r != "cli":
                seen.add(r)
                todo.extend(rules.get(r, ()))
        return seen

    assert [r for r in rules if r != "cli" and r in reach(r)] == []


@pytest.mark.parametrize("module", ["trainfit", "trainfit.job", "trainfit.tune.search",
                                    "trainfit.tune.trial", "trainfit.tune.result"])
def test_pure_rooms_import_no_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports torch"
