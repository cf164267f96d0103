"""What every stage of the build shares: paths, failures, the notebooks and
their parse."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NUMBERS = ROOT / "numbers.toml"
LEDGER = ROOT / "book" / "ledger.md"
EXERCISES = ROOT / "book" / "exercises.md"
BUILD = ROOT / "_build"
CACHE = BUILD / ".jupyter_cache"
MODULE = ROOT / "scripts" / "tx_part4.py"


class BuildError(Exception):
    """A failure of the build, with a message for the maintainer."""


def fail(message: str) -> None:
    """Stop the build with a message."""
    raise BuildError(message)


def rel(path: Path) -> str:
    """A path as the messages show it: relative to the repository where it
    can be."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def notebook_sources() -> list[Path]:
    """The MyST-markdown notebooks, in the order of their names."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.md"))


def book_config() -> dict:
    """_config.yml, read once for the build and the tests."""
    import yaml

    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


#: Seconds a cell may run (_config.yml's execute.timeout): the longest any
#: step of the build waits.
TIMEOUT = int(book_config()["execute"]["timeout"])


def repository_url() -> str:
    """The repository named in _config.yml: the one place the Colab cell and
    buttons read it."""
    return book_config()["repository"]["url"]


def read_md(path: Path):
    """Read a MyST-markdown notebook with jupytext."""
    import jupytext

    return jupytext.read(path, fmt="md:myst")


def module_constant(name: str):
    """A constant of tx_part4.py, read from its source (importing the
    module imports torch: seconds on every build command)."""
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [getattr(node, "target", None)])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{rel(MODULE)} defines no constant {name}")


def write_if_changed(path: Path, text: str) -> str:
    """Write a generated page only when its text changes: Sphinx re-reads a
    page whose file is newer than its last reading. Returns what happened,
    for the build's log."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return "unchanged"
    path.write_text(text, encoding="utf-8")
    return "written"


