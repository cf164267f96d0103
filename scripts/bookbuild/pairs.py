"""Stage 1, pairs and #@save: every notebooks/NN_name.md has its .ipynb pair
(same cells, no outputs, the Colab cell first), every cell marked #@save
stands unchanged in scripts/tx_part4.py, and no code line a reader sees is
wider than the page. `sync` rewrites the pairs and the module's blocks."""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from pathlib import Path

from bookbuild.common import (
    MODULE,
    fail,
    notebook_sources,
    read_md,
    rel,
    repository_url,
    write_if_changed,
)

#: The first cell of every notebook, hidden in the book. The repository is
#: named in _config.yml.
COLAB_CELL = """\
# Colab only: install the book's helpers and libraries. Elsewhere this cell does nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "why-self-attention @ git+{repository}"], check=True)"""



def colab_cell() -> str:
    """The Colab cell, with the repository filled in."""
    return COLAB_CELL.format(repository=repository_url())


def ipynb_text(md_path: Path) -> str:
    """The .ipynb that pairs with a .md: same cells, no outputs, as jupytext
    writes it."""
    import jupytext

    notebook = read_md(md_path)
    seen: dict[str, int] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        digest = hashlib.sha1(cell.source.encode("utf-8")).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        # stable ids: no churn in git on re-sync
        cell.id = f"{digest}-{seen[digest]}"
    return jupytext.writes(notebook, fmt="ipynb")


def first_code_cell(notebook):
    """The first code cell of a notebook, or None."""
    return next((c for c in notebook.cells if c.cell_type == "code"), None)


def cells(text: str) -> list[tuple]:
    """An .ipynb's cells as the pair check compares them."""
    import nbformat

    notebook = nbformat.reads(text, as_version=4)
    return [(c.cell_type, c.source, c.get("outputs"),
             c.get("execution_count")) for c in notebook.cells]


def check_sync() -> None:
    """Every .md has an .ipynb with the same cells and no outputs, and
    starts with the Colab cell."""
    problems = []
    sources = notebook_sources()
    if not sources:
        problems.append("notebooks/: no notebook NN_name.md found")
    for md in sources:
        name = rel(md)
        cell = first_code_cell(read_md(md))
        if cell is None or cell.source.strip() != colab_cell().strip():
            problems.append(f"{name}: the first code cell is not the Colab cell (run `make sync`)")
        elif "remove-cell" not in cell.metadata.get("tags", []):
            problems.append(f"{name}: the Colab cell is not tagged remove-cell (run `make sync`)")
        ipynb = md.with_suffix(".ipynb")
        if not ipynb.exists():
            problems.append(f"{rel(ipynb)}: missing (run `make sync`)")
        elif cells(ipynb.read_text(encoding="utf-8")) != cells(
                ipynb_text(md)):
            problems.append(f"{rel(ipynb)}: differs from its .md or "
                            "carries outputs (run `make sync`)")
    if problems:
        fail("notebook pairs out of sync:\n  " + "\n  ".join(problems))
    print(f"pairs: {len(sources)} notebooks in sync, no outputs")
    check_saved()
    check_width()


#: The widest code line a reader sees without a sideways scroll bar (the
#: site's column at a 1,280 px window). Saved cells are copied into
#: tx_part4.py unchanged: the module keeps it too.
CODE_WIDTH = 76
#: Tags of the cells a reader never sees: exempt. `hide-input` cells count
#: (readers expand them).
UNSEEN = {"remove-cell", "remove-input"}


def wide_lines(md: Path, width: int = CODE_WIDTH) -> list[str]:
    """Every line wider than `width` in a code cell a reader can see: the
    page, the line in the .md and its length."""
    text = md.read_text(encoding="utf-8")
    found, at = [], 0
    for cell in read_md(md).cells:
        if cell.cell_type != "code":
            continue
        where = text.find(cell.source, at) if cell.source else -1
        if where >= 0:
            at = where + len(cell.source)
        if UNSEEN & set(cell.metadata.get("tags", [])):
            continue
        first = text[:where].count("\n") + 1 if where >= 0 else None
        for offset, line in enumerate(cell.source.splitlines()):
            if len(line) > width:
                place = f"line {first + offset}" if first else "a code cell"
                found.append(f"{rel(md)}, {place}: {len(line)} characters "
                             f"(at most {width}): {line.strip()[:50]}")
    return found


def check_width() -> None:
    """No code line a reader can see is wider than the page (CODE_WIDTH
    characters)."""
    problems = [line for md in notebook_sources() for line in wide_lines(md)]
    if problems:
        fail(f"{len(problems)} visible code line(s) wider than {CODE_WIDTH} characters: put a "
             "comment that does not fit on the line above, break long calls:\n  "
             + "\n  ".join(problems))
    print(f"code width: every visible code line fits in {CODE_WIDTH} characters")


def sync() -> None:
    """Take a newer .ipynb's edits into its .md, put the Colab cell first,
    rewrite the .ipynb."""
    import jupytext
    from nbformat.v4 import new_code_cell

    for md in notebook_sources():
        ipynb = md.with_suffix(".ipynb")
        if ipynb.exists() and ipynb.stat().st_mtime > md.stat().st_mtime:
            edited = jupytext.read(ipynb)
            if [c.source for c in edited.cells] != [c.source for c in read_md(md).cells]:
                edited.metadata = read_md(md).metadata      # keep the .md's header
                jupytext.write(edited, md, fmt="md:myst")
                print(f"{rel(md)}: updated from the newer {ipynb.name}")
        notebook = read_md(md)
        cell = first_code_cell(notebook)
        colab = new_code_cell(colab_cell(), metadata={"tags": ["remove-cell"]})
        if cell is not None and cell.source.lstrip().startswith("# Colab only"):
            notebook.cells[notebook.cells.index(cell)] = colab
        else:
            notebook.cells.insert(0, colab)
        # Only what changes is written: Sphinx reads a page again when its
        # file is newer.
        written = write_if_changed(md, jupytext.writes(notebook, fmt="md:myst"))
        written = write_if_changed(ipynb, ipynb_text(md)) == "written" or written == "written"
        print(f"{rel(md)} -> {ipynb.name}{'' if written else ': unchanged'}")
    sync_saved()


# ── saved cells: one source for a notebook's mechanisms and the module ─────────────────────

SAVE_MARK = "#@save"                                  # d2l's mark: the first line of a saved cell
#: Top-level statements a saved cell may hold: definitions only, nothing
#: that runs or prints.
SAVABLE = (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def block_begin(page: str) -> str:
    """The line that opens a notebook's block in tx_part4.py."""
    return f"# ── saved from notebooks/{page}.md ({SAVE_MARK}): edit there ──"


def block_end(page: str) -> str:
    """The line that closes a notebook's block in tx_part4.py."""
    return f"# ── end of the cells saved from notebooks/{page}.md ──"


def saved_cells(md: Path) -> list[str]:
    """The code cells of a notebook marked #@save, without the mark; each
    may only define things."""
    cells = []
    for cell in read_md(md).cells:
        lines = cell.source.splitlines()
        if cell.cell_type != "code" or not lines or lines[0].strip() != SAVE_MARK:
            continue
        code = "\n".join(lines[1:]).strip("\n")
        try:
            tree = ast.parse(code)
        except SyntaxError as error:
            fail(f"{rel(md)}: a cell marked {SAVE_MARK} is not valid Python: {error}")
        for node in tree.body:
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if not (isinstance(node, SAVABLE) or docstring):
                fail(f"{rel(md)}: a cell marked {SAVE_MARK} may only define functions, classes and "
                     f"constants; line {node.lineno} of the cell is a {type(node).__name__}: "
                     f"{ast.get_source_segment(code, node).splitlines()[0]!r}")
        cells.append(code)
    return cells


def saved_block(md: Path) -> str | None:
    """The block tx_part4.py must hold for a notebook, or None if it saves
    nothing."""
    cells = saved_cells(md)
    if not cells:
        return None
    body = "\n\n\n".join(cells)
    return f"{block_begin(md.stem)}\n\n{body}\n\n{block_end(md.stem)}"


def module_blocks(text: str) -> dict[str, str]:
    """Every saved block in the module's text, by notebook stem."""
    pattern = re.compile(r"^# ── saved from notebooks/(?P<page>[\w-]+)\.md\b.*?^# ── end of the cells "
                         r"saved from notebooks/(?P=page)\.md ──$", re.S | re.M)
    return {m["page"]: m[0] for m in pattern.finditer(text)}


def check_saved(module: Path = MODULE) -> None:
    """Every notebook's saved cells stand, character for character, in
    tx_part4.py.

    Fails showing the first line that differs: the cell a reader edits
    and the module the later parts import must never silently disagree."""
    text = module.read_text(encoding="utf-8")
    blocks = module_blocks(text)
    problems = [f"{rel(module)} holds {count} blocks for notebooks/{page}.md: keep one"
                for page in blocks if (count := text.count(f"# ── saved from notebooks/{page}.md")) > 1]
    for md in notebook_sources():
        want, have = saved_block(md), blocks.pop(md.stem, None)
        if want == have:
            continue
        if want is None:
            problems.append(f"{rel(module)} holds a block for {rel(md)}, "
                            "which saves no cell")
        elif have is None:
            problems.append(f"{rel(module)} has no block for {rel(md)}'s "
                            "saved cells")
        else:
            first = next(line for line in difflib.unified_diff(
                have.splitlines(), want.splitlines(), n=0, lineterm="")
                if line[:1] in "+-" and line[:3] not in ("+++", "---"))
            problems.append(f"{rel(md)} and {rel(module)} disagree: "
                            f"{first.strip()[:70]}")
    problems += [f"{rel(module)} holds a block for notebooks/{page}.md, which does not exist"
                 for page in blocks]
    if problems:
        fail("saved cells and the module differ (run `make sync`, which writes the module "
             "from the notebooks):\n  " + "\n  ".join(problems))
    print(f"saved cells: {sum(1 for md in notebook_sources() if saved_block(md))} notebooks' "
          f"mechanisms stand unchanged in {rel(module)}")


def sync_saved(module: Path = MODULE) -> None:
    """Write each notebook's saved cells into its block of tx_part4.py (a
    new block goes before the command line section)."""
    text = module.read_text(encoding="utf-8")
    blocks = module_blocks(text)
    for md in notebook_sources():
        want, have = saved_block(md), blocks.get(md.stem)
        if want == have:
            continue
        if have is not None:
            text = text.replace(have, want or "")
        elif want is not None:
            marker = "# Command line"
            at = text.index(marker)
            at = text.rindex("\n# ═", 0, at) + 1
            text = text[:at] + want + "\n\n\n" + text[at:]
        print(f"{rel(module)}: block of {rel(md)} rewritten")
    write_if_changed(module, text)


