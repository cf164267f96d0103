"""What every stage shares: paths, failures, the notebooks."""

import ast
from pathlib import Path

import yaml

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
    raise BuildError(message)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def notebook_sources() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.md"))


def book_config() -> dict:
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


#: Seconds a cell may run (_config.yml): the longest any step waits.
TIMEOUT = int(book_config()["execute"]["timeout"])


def repository_url() -> str:
    """The repository of _config.yml (the Colab cell, the buttons)."""
    return book_config()["repository"]["url"]


def read_md(path: Path):
    import jupytext

    return jupytext.read(path, fmt="md:myst")


def module_constant(name: str):
    """A constant of tx_part4.py, read from its source (importing it
    imports torch: seconds on every build command)."""
    for node in ast.parse(MODULE.read_text(encoding="utf-8")).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [getattr(node, "target", None)])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{rel(MODULE)} defines no constant {name}")


def write_if_changed(path: Path, text: str) -> str:
    """Write a page only when its text changes (Sphinx reads a page again
    when its file is newer); says which, for the log."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return "unchanged"
    path.write_text(text, encoding="utf-8")
    return "written"
