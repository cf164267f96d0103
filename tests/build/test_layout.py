"""The build's own shape, as the README states it: the build code (every tracked .py file under
scripts/ but the helpers, tx_part4.py, and their configs) is at most 1,500 lines, no file of it
is over 400, the stages of scripts/bookbuild/ import only those before them, and the width the
book enforces on code is ruff's line length and the module's WIDTH."""

from __future__ import annotations

import ast
import subprocess
import tomllib

from bookbuild import common, pairs

#: scripts/book.py's order of the stages: each may import only those before it
STAGES = ("common", "pairs", "execute", "numbers", "ledger", "site", "pdf", "compat", "newest")


def build_files() -> list:
    listed = subprocess.run(["git", "ls-files", "scripts/*.py", "scripts/**/*.py"], cwd=common.ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [common.ROOT / name for name in listed
            if name != "scripts/tx_part4.py" and not name.startswith("scripts/tx_model_configs/")]


def test_the_build_code_stays_within_its_budget():
    lines = {path.relative_to(common.ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in build_files()}
    assert "scripts/bookbuild/execute.py" in lines and "scripts/book.py" in lines
    assert sum(lines.values()) <= 1500, f"build code: {sum(lines.values())} lines (at most 1,500)"
    assert not {name: n for name, n in lines.items() if n > 400}, "a build file over 400 lines"


def test_each_stage_imports_only_those_before_it():
    for stage in STAGES:
        tree = ast.parse((common.ROOT / "scripts" / "bookbuild" / f"{stage}.py").read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "bookbuild" for alias in node.names}
        imported |= {node.module.split(".")[1] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bookbuild.")}
        later = imported - set(STAGES[:STAGES.index(stage)])
        assert not later, f"bookbuild/{stage}.py imports {sorted(later)}, a stage at or after it"


def test_one_width_for_code_ruff_and_the_module():
    ruff = tomllib.loads((common.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert ruff["line-length"] == pairs.CODE_WIDTH == common.module_constant("WIDTH")
