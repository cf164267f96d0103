"""Stage 1: every notebooks/NN_name.md has its .ipynb pair (same cells,
no outputs, the Colab cell first), every cell marked #@save stands as it
is in scripts/tx_part4.py, and no code line a reader sees is wider than
the page. `sync` rewrites the pairs and the module's blocks."""

import ast
import difflib
import hashlib
import re
import subprocess
from pathlib import Path

from bookbuild import common
from bookbuild.common import MODULE, fail, read_md, rel

#: The first cell of every notebook, hidden in the book.
COLAB_CELL = (
    "# Colab only: install the book's helpers and libraries. Elsewhere "
    "this cell does nothing.\n"
    'import sys\nif "google.colab" in sys.modules:\n'
    "    import subprocess\n"
    '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
    '                    "why-self-attention @ git+{repository}"], '
    "check=True)")
#: The widest code line a reader sees without scrolling (the site's column
#: at a 1,280 px window); the module keeps it too (ruff's line length).
CODE_WIDTH = 76
#: Tags of the cells a reader never sees (`hide-input` cells count).
UNSEEN = {"remove-cell", "remove-input"}
SAVE_MARK = "#@save"            # d2l's mark: a saved cell's first line
#: A saved cell may only define things: nothing that runs or prints.
SAVABLE = (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def colab_cell() -> str:
    return COLAB_CELL.format(repository=common.repository_url())


def ipynb_text(md_path: Path) -> str:
    """The .ipynb that pairs with a .md: same cells, no outputs, ids made
    from the cells (no churn in git on re-sync)."""
    import jupytext

    notebook, seen = read_md(md_path), {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        digest = hashlib.sha1(cell.source.encode("utf-8")).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = f"{digest}-{seen[digest]}"
    return jupytext.writes(notebook, fmt="ipynb")


def first_code_cell(notebook):
    return next((c for c in notebook.cells if c.cell_type == "code"), None)


def cells(text: str) -> list[tuple]:
    """An .ipynb's cells as the pair check compares them."""
    import nbformat

    notebook = nbformat.reads(text, as_version=4)
    return [(c.cell_type, c.source, c.get("outputs"), c.get(
        "execution_count"), c.metadata.get("tags")) for c in notebook.cells]


def check_sync() -> None:
    """The pairs, then the saved cells and the code width."""
    problems, sources = [], common.notebook_sources()
    if not sources:
        problems.append("notebooks/: no notebook NN_name.md found")
    for md in sources:
        cell, ipynb = first_code_cell(read_md(md)), md.with_suffix(".ipynb")
        if cell is None or cell.source.strip() != colab_cell().strip():
            problems.append(f"{rel(md)}: the first code cell is not the "
                            "Colab cell")
        elif "remove-cell" not in cell.metadata.get("tags", []):
            problems.append(f"{rel(md)}: the Colab cell is not tagged "
                            "remove-cell")
        if not ipynb.exists():
            problems.append(f"{rel(ipynb)}: missing")
        elif cells(ipynb.read_text(encoding="utf-8")) != cells(
                ipynb_text(md)):
            problems.append(f"{rel(ipynb)}: differs from its .md or "
                            "carries outputs")
    if problems:
        fail("notebook pairs out of sync (run `make sync`):\n  "
             + "\n  ".join(problems))
    print(f"pairs: {len(sources)} notebooks in sync, no outputs")
    check_saved()
    check_width()


def wide_lines(md: Path, width: int = CODE_WIDTH) -> list[str]:
    """Every line wider than `width` in a code cell a reader can see: the
    page, the line in the .md, its length."""
    text, found, at = md.read_text(encoding="utf-8"), [], 0
    for cell in read_md(md).cells:
        if cell.cell_type != "code":
            continue
        where = text.find(cell.source, at) if cell.source else -1
        at = where + len(cell.source) if where >= 0 else at
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
    """No code line a reader can see is wider than CODE_WIDTH."""
    problems = [line for md in common.notebook_sources()
                for line in wide_lines(md)]
    if problems:
        fail(f"{len(problems)} visible code line(s) wider than {CODE_WIDTH}"
             " characters: put a comment that does not fit on the line "
             "above, break long calls:\n  " + "\n  ".join(problems))
    print(f"code width: every visible code line fits in {CODE_WIDTH} "
          "characters")


def edited_since_commit(path: Path) -> bool:
    """Whether `path` may hold edits not yet committed: git sees some, or
    git cannot tell (not a checkout), so that a sync keeps both."""
    done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--",
                           path.name], cwd=path.parent, capture_output=True)
    return done.returncode != 0


def sync() -> None:
    """Take a newer .ipynb's edits into its .md, put the Colab cell first,
    rewrite the .ipynb; write only what changes (Sphinx reads a page again
    when its file is newer)."""
    import jupytext
    from nbformat.v4 import new_code_cell

    for md in common.notebook_sources():
        ipynb = md.with_suffix(".ipynb")
        if ipynb.exists() and ipynb.stat().st_mtime > md.stat().st_mtime:
            edited, old = jupytext.read(ipynb), read_md(md)
            if [c.source for c in edited.cells] != [
                    c.source for c in old.cells]:
                if edited_since_commit(md):   # both edited: keep neither
                    fail(f"{rel(md)} has edits not yet committed, and the "
                         f"newer {ipynb.name} has other cells: a sync "
                         "would lose one of them. To keep the .md, touch "
                         "it; to keep the .ipynb, commit or stash the "
                         ".md's edits; then run `make sync` again")
                edited.metadata = old.metadata       # the .md's header
                jupytext.write(edited, md, fmt="md:myst")
                print(f"{rel(md)}: updated from the newer {ipynb.name}")
        notebook = read_md(md)
        cell = first_code_cell(notebook)
        colab = new_code_cell(colab_cell(),
                              metadata={"tags": ["remove-cell"]})
        if cell is not None and cell.source.lstrip().startswith(
                "# Colab only"):
            notebook.cells[notebook.cells.index(cell)] = colab
        else:
            notebook.cells.insert(0, colab)
        written = {common.write_if_changed(md, jupytext.writes(
            notebook, fmt="md:myst")), common.write_if_changed(
                ipynb, ipynb_text(md))}
        print(f"{rel(md)} -> {ipynb.name}"
              + ("" if "written" in written else ": unchanged"))
    sync_saved()


# ── saved cells: one source for a page's mechanisms and the module ────


def saved_cells(md: Path) -> list[str]:
    """The code cells of a notebook marked #@save, without the mark; each
    may only define things."""
    found = []
    for cell in read_md(md).cells:
        lines = cell.source.splitlines()
        if (cell.cell_type != "code" or not lines
                or lines[0].strip() != SAVE_MARK):
            continue
        code = "\n".join(lines[1:]).strip("\n")
        try:
            tree = ast.parse(code)
        except SyntaxError as error:
            fail(f"{rel(md)}: a cell marked {SAVE_MARK} is not valid "
                 f"Python: {error}")
        for node in tree.body:
            if not (isinstance(node, SAVABLE) or isinstance(node, ast.Expr)
                    and isinstance(node.value, ast.Constant)):
                line = ast.get_source_segment(code, node).splitlines()[0]
                fail(f"{rel(md)}: a cell marked {SAVE_MARK} may only "
                     "define functions, classes and constants; line "
                     f"{node.lineno} of the cell is a "
                     f"{type(node).__name__}: {line!r}")
        found.append(code)
    return found


def saved_block(md: Path) -> str | None:
    """The block tx_part4.py must hold for a notebook, or None."""
    found = saved_cells(md)
    if not found:
        return None
    return (f"# ── saved from notebooks/{md.stem}.md ({SAVE_MARK}): edit "
            f"there ──\n\n" + "\n\n\n".join(found) + "\n\n# ── end of the"
            f" cells saved from notebooks/{md.stem}.md ──")


BLOCK = re.compile(r"^# ── saved from notebooks/(?P<page>[\w-]+)\.md\b.*?"
                   r"^# ── end of the cells saved from "
                   r"notebooks/(?P=page)\.md ──$", re.S | re.M)


def check_saved(module: Path = MODULE) -> None:
    """Every notebook's saved cells stand, character for character, in
    tx_part4.py; a failure shows the first line that differs."""
    text = module.read_text(encoding="utf-8")
    blocks = {m["page"]: m[0] for m in BLOCK.finditer(text)}
    problems = [f"{rel(module)} holds {n} blocks for notebooks/{page}.md:"
                " keep one" for page in blocks if (n := text.count(
                    f"# ── saved from notebooks/{page}.md")) > 1]
    for md in common.notebook_sources():
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
    problems += [f"{rel(module)} holds a block for notebooks/{page}.md, "
                 "which does not exist" for page in blocks]
    if problems:
        fail("saved cells and the module differ (run `make sync`, which "
             "writes the module from the notebooks):\n  "
             + "\n  ".join(problems))
    print("saved cells: every notebook's mechanisms stand unchanged in "
          f"{rel(module)}")


def sync_saved(module: Path = MODULE) -> None:
    """Write each notebook's saved cells into its block of tx_part4.py (a
    new block goes before the command line's section)."""
    text = module.read_text(encoding="utf-8")
    blocks = {m["page"]: m[0] for m in BLOCK.finditer(text)}
    for md in common.notebook_sources():
        want, have = saved_block(md), blocks.get(md.stem)
        if want == have:
            continue
        if have is not None:
            text = text.replace(have, want or "")
        else:
            at = text.rindex("\n# ═", 0, text.index("# Command line")) + 1
            text = text[:at] + want + "\n\n\n" + text[at:]
        print(f"{rel(module)}: block of {rel(md)} rewritten")
    common.write_if_changed(module, text)
