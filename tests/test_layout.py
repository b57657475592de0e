"""The layout holds: the layering contracts bite, the ground floor is listed whole, modules stay
small enough to read (or say why not)."""

from __future__ import annotations

import ast
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import tidemark

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["tidemark", "orchestration", "jobs", "state", "resources"]
LONG_MODULE_LINES = 400
LONG_REASON = "Long because"


def _importlinter() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(kind: str) -> dict:
    return next(c for c in _importlinter()["contracts"] if c["type"] == kind)


def test_the_ground_floor_layer_lists_every_module_of_tidemark_but_the_cli() -> None:
    ground = {m.strip() for m in _contract("layers")["layers"][-1].split(":")}
    modules = {f"tidemark.{m.name}" for m in pkgutil.iter_modules(tidemark.__path__)}
    assert ground == modules - {"tidemark.cli"}
    assert ground <= set(_contract("forbidden")["source_modules"])


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("jobs/raw_zone.py", "import orchestration.definitions"),
        ("state/records.py", "import jobs.capture"),
        ("tidemark/errors.py", "import state"),
        ("jobs/transform/fold.py", "import jobs.capture._events"),
        ("resources/mongo.py", "import dagster"),
    ],
)
def test_an_upward_import_breaks_the_lint(tree_copy: Path, module: str, upward: str) -> None:
    assert _lint_imports(tree_copy).returncode == 0
    target = tree_copy / module
    if not target.exists():  # a module the layout may not have: the package's __init__ then
        target = target.parent / "__init__.py"
    target.write_text(target.read_text() + f"\n{upward}  # noqa\n")
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_a_long_module_says_why_in_its_docstring() -> None:
    unexplained = [
        str(p.relative_to(ROOT))
        for p in _modules()
        if p.read_text().count("\n") > LONG_MODULE_LINES
        and LONG_REASON not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    # Split such a module along a seam, or say why it is one ("Long because ...").
    assert unexplained == []


def test_every_module_opens_with_a_docstring() -> None:
    missing = [
        str(p.relative_to(ROOT))
        for p in _modules()
        if p.read_text().strip() and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert missing == []
