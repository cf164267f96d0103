"""The book's build tool: pairs, execution, the number check, the ledger, the HTML site.

    python scripts/book.py build          everything `make book` does, in order (--fresh, or CI=true:
                                          execute every notebook and render every page)
    python scripts/book.py check-sync     every notebooks/*.md has an in-sync .ipynb without outputs,
                                          its cells marked #@save stand unchanged in tx_part4.py, and
                                          no code line a reader sees is wider than 76 characters
    python scripts/book.py sync           rewrite the .ipynb (and the Colab cell) from the .md, and
                                          tx_part4.py's saved blocks from the cells marked #@save
    python scripts/book.py execute        execute the notebooks whose inputs changed (--fresh: all),
                                          in parallel, into the cache the site renders from
    python scripts/book.py check-numbers  compare the glued numbers with numbers.toml
    python scripts/book.py numbers        accept the glued numbers into numbers.toml, show the diff
    python scripts/book.py ledger         write book/ledger.md from numbers.toml and the build
    python scripts/book.py exercises      write book/exercises.md, every exercise of every part
    python scripts/book.py html           render the site from the cache, warnings as errors

Every failure exits non-zero with a message that names the notebook, the cell or the key.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import difflib
import hashlib
import html as html_module
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NUMBERS = ROOT / "numbers.toml"
LEDGER = ROOT / "book" / "ledger.md"
BUILD = Path(os.environ.get("BOOK_BUILD_DIR") or ROOT / "_build")   # `make compat` builds apart
CACHE = BUILD / ".jupyter_cache"
TIMES = BUILD / "execution_times.json"
READER = {"name": "myst_nb_md", "type": "plugin"}   # the reader myst-nb itself uses for .md
MODULE = ROOT / "scripts" / "tx_part4.py"


def module_constant(name: str):
    """A constant of tx_part4.py, read from its source: the build shares the helpers' constants
    without importing them (importing tx_part4 imports torch, seconds on every build command)."""
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{rel(MODULE)} defines no constant {name}")


GLUE_PREFIX = module_constant("GLUE_PREFIX")           # where myst-nb keeps a glued value
KINDS = module_constant("KINDS")                       # exact, close, seeded, measured, recorded
DEFAULT_TOL = {"close": 1e-9, "seeded": 1e-6}        # relative tolerance when numbers.toml gives none
TIMEOUT = 300                                        # seconds a cell may run before the build fails
BUDGET_NOTEBOOK = 20.0                               # seconds one notebook should take (warned, not failed)
BUDGET_BUILD = 40.0                                  # seconds a fresh `make book` should take
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"   # Jupyter's: figures in the outputs
RENDER_SIGNALS = "WHY_SELF_ATTENTION_RENDER_SIGNALS"  # scripts/executed_pages.py waits on them
RENDER_NICENESS = 10                                 # Sphinx's priority beside the kernels (nice)

#: The first cell of every notebook, hidden in the book. The repository is named in _config.yml.
COLAB_CELL = """\
# Colab only: install the book's helpers and libraries. Elsewhere this cell does nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "why-self-attention @ git+{repository}"], check=True)"""


class BuildError(Exception):
    """A failure of the build, with a message for the maintainer."""


def fail(message: str) -> None:
    """Stop the build with a message."""
    raise BuildError(message)


# ── pairs ─────────────────────────────────────────────────────────────────────────────────


def rel(path: Path) -> str:
    """A path as the messages show it: relative to the repository where it can be."""
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

    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def repository_url() -> str:
    """The repository named in _config.yml: the one place the Colab cell and buttons read it."""
    return book_config()["repository"]["url"]


def colab_cell() -> str:
    """The Colab cell, with the repository filled in."""
    return COLAB_CELL.format(repository=repository_url())


#: Notebooks parsed in this process, by (path, modification time, size): every step of the build
#: reads each .md, and a parse costs about 0.2 s (jupytext validates every cell).
_PARSED: dict[tuple, object] = {}


def read_md(path: Path, copy: bool = False):
    """Read a MyST-markdown notebook with jupytext, once while the file is unchanged. The
    notebook is shared by every caller: one that edits it asks for a `copy`."""
    import copy as copying

    import jupytext

    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        _PARSED[key] = jupytext.read(path, fmt="md:myst")
    return copying.deepcopy(_PARSED[key]) if copy else _PARSED[key]


def read_for_cache(path: Path):
    """A notebook as the cache keys it: jupyter-cache hashes the code cells and the kernelspec,
    which jupytext reads exactly as myst-nb's reader does (tests/test_mechanics.py checks it),
    so the parse that check-sync made serves to find the executed copy."""
    return read_md(path)


def ipynb_text(md_path: Path) -> str:
    """The .ipynb that pairs with a .md: same cells, no outputs, as jupytext writes it."""
    import jupytext

    notebook = read_md(md_path, copy=True)
    seen: dict[str, int] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        digest = hashlib.sha1(cell.source.encode("utf-8")).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = f"{digest}-{seen[digest]}"        # stable ids: no churn in git on re-sync
    return jupytext.writes(notebook, fmt="ipynb")


def first_code_cell(notebook):
    """The first code cell of a notebook, or None."""
    return next((c for c in notebook.cells if c.cell_type == "code"), None)


def check_sync() -> None:
    """Every .md has an .ipynb with the same cells and no outputs, and starts with the Colab cell."""
    import nbformat

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
            continue
        text, want_text = ipynb.read_text(encoding="utf-8"), ipynb_text(md)
        if text == want_text:
            continue                   # exactly what `make sync` writes: no need to look closer
        committed = nbformat.reads(text, as_version=4)
        for index, cell in enumerate(committed.cells):
            if cell.cell_type == "code" and (cell.outputs or cell.execution_count):
                problems.append(f"{rel(ipynb)}: cell {index} carries outputs (run `make sync`)")
        expected = nbformat.reads(want_text, as_version=4)
        pairs = list(zip(committed.cells, expected.cells))
        if len(committed.cells) != len(expected.cells):
            problems.append(f"{rel(ipynb)}: {len(committed.cells)} cells, its .md has "
                            f"{len(expected.cells)} (run `make sync`)")
        for index, (have, want) in enumerate(pairs):
            if (have.cell_type, have.source) != (want.cell_type, want.source):
                problems.append(f"{rel(ipynb)}: cell {index} differs from its .md "
                                f"(run `make sync`)")
                break
    if problems:
        fail("notebook pairs out of sync:\n  " + "\n  ".join(problems))
    print(f"pairs: {len(sources)} notebooks in sync, no outputs")
    check_saved()
    check_width()


#: The widest code line a reader sees without a sideways scroll bar (the site's column at a
#: 1,280 px window). Saved cells are copied into tx_part4.py unchanged: the module keeps it too.
CODE_WIDTH = 76
#: Tags of the cells a reader never sees: exempt. `hide-input` cells count (readers expand them).
UNSEEN = {"remove-cell", "remove-input"}


def wide_lines(md: Path, width: int = CODE_WIDTH) -> list[str]:
    """Every line wider than `width` in a code cell a reader can see: the page, the line in the
    .md and its length."""
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
    """No code line a reader can see is wider than the page (CODE_WIDTH characters)."""
    problems = [line for md in notebook_sources() for line in wide_lines(md)]
    if problems:
        fail(f"{len(problems)} visible code line(s) wider than {CODE_WIDTH} characters: put a "
             "comment that does not fit on the line above, break long calls:\n  "
             + "\n  ".join(problems))
    print(f"code width: every visible code line fits in {CODE_WIDTH} characters")


def sync() -> None:
    """Take a newer .ipynb's edits into its .md, put the Colab cell first, rewrite the .ipynb."""
    import jupytext
    from nbformat.v4 import new_code_cell

    for md in notebook_sources():
        ipynb = md.with_suffix(".ipynb")
        if ipynb.exists() and ipynb.stat().st_mtime > md.stat().st_mtime:
            edited = jupytext.read(ipynb)
            if [c.source for c in edited.cells] != [c.source for c in read_md(md).cells]:
                edited.metadata = read_md(md, copy=True).metadata      # keep the .md's header
                jupytext.write(edited, md, fmt="md:myst")
                print(f"{rel(md)}: updated from the newer {ipynb.name}")
        notebook = read_md(md, copy=True)
        cell = first_code_cell(notebook)
        colab = new_code_cell(colab_cell(), metadata={"tags": ["remove-cell"]})
        if cell is not None and cell.source.lstrip().startswith("# Colab only"):
            notebook.cells[notebook.cells.index(cell)] = colab
        else:
            notebook.cells.insert(0, colab)
        # Only what changes is written: Sphinx reads a page again when its file is newer.
        written = write_if_changed(md, jupytext.writes(notebook, fmt="md:myst"))
        written = write_if_changed(ipynb, ipynb_text(md)) == "written" or written == "written"
        print(f"{rel(md)} -> {ipynb.name}{'' if written else ': unchanged'}")
    sync_saved()


# ── saved cells: one source for a notebook's mechanisms and the module ─────────────────────

SAVE_MARK = "#@save"                                  # d2l's mark: the first line of a saved cell
#: Top-level statements a saved cell may hold: definitions only, nothing that runs or prints.
SAVABLE = (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def block_begin(page: str) -> str:
    """The line that opens a notebook's block in tx_part4.py."""
    return f"# ── saved from notebooks/{page}.md ({SAVE_MARK}): edit there ──"


def block_end(page: str) -> str:
    """The line that closes a notebook's block in tx_part4.py."""
    return f"# ── end of the cells saved from notebooks/{page}.md ──"


def saved_cells(md: Path) -> list[str]:
    """The code cells of a notebook marked #@save, without the mark; each may only define things."""
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
    """The block tx_part4.py must hold for a notebook, or None if it saves nothing."""
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


def definitions(code: str) -> dict[str, str]:
    """Each top-level name a block defines, with its source (a block that does not parse: {})."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {}
    found = {}
    for node in tree.body:
        names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                 [t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                  if isinstance(t, ast.Name)])
        for name in names:
            found[name] = ast.get_source_segment(code, node)
    return found


def same_body(want: str | None, have: str | None) -> bool:
    """Two copies of a block that differ only in the wording of their first line (an older
    `make sync` wrote a longer one; the next `make sync` rewrites it)."""
    return bool(want and have) and want.split("\n", 1)[1:] == have.split("\n", 1)[1:]


def check_saved(module: Path = MODULE) -> None:
    """Every notebook's saved cells stand, character for character, in tx_part4.py.

    Fails naming each function or class that differs: the cell a reader edits and the module
    the later parts import must never silently disagree."""
    text = module.read_text(encoding="utf-8")
    blocks = module_blocks(text)
    problems = [f"{rel(module)} holds {count} blocks for notebooks/{page}.md: keep one"
                for page in blocks if (count := text.count(f"# ── saved from notebooks/{page}.md")) > 1]
    for md in notebook_sources():
        want, have = saved_block(md), blocks.pop(md.stem, None)
        if want == have or same_body(want, have):
            continue
        if want is None:
            problems.append(f"{rel(module)} holds a block for {rel(md)}, which saves no cell")
            continue
        if have is None:
            problems.append(f"{rel(module)} has no block for {rel(md)}'s saved cells")
            continue
        cell_defs, module_defs = definitions(want), definitions(have)
        names = sorted({name for name in cell_defs.keys() | module_defs.keys()
                        if cell_defs.get(name) != module_defs.get(name)})
        what = ", ".join(f"`{name}`" for name in names) or "the order or spacing of its cells"
        problems.append(f"{rel(md)} and {rel(module)} disagree on {what}")
    problems += [f"{rel(module)} holds a block for notebooks/{page}.md, which does not exist"
                 for page in blocks]
    if problems:
        fail("saved cells and the module differ (run `make sync`, which writes the module "
             "from the notebooks):\n  " + "\n  ".join(problems))
    print(f"saved cells: {sum(1 for md in notebook_sources() if saved_block(md))} notebooks' "
          f"mechanisms stand unchanged in {rel(module)}")


def sync_saved(module: Path = MODULE) -> None:
    """Write each notebook's saved cells into its block of tx_part4.py (a new block goes before
    the command line section)."""
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


# ── execution ─────────────────────────────────────────────────────────────────────────────


#: The kernels' transport: encrypted (CurveZMQ) where jupyter_client can provision the keys.
#: ipykernel 7.3+ warns on every start of a kernel that talks plain TCP; jupyter_client 8.10+
#: provisions keys for a kernel whose spec declares it supports them ("auto").
KERNEL_CONFIG = {"KernelManager": {"transport_encryption": "auto"}}


def kernel_config():
    """The traitlets config of every kernel the build, the tests and compat start (empty with a
    jupyter_client too old to encrypt: a config it does not know would be warned about)."""
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_traits():
        return Config()
    return Config(KERNEL_CONFIG)


def kernel_manager(kernel_name: str = "python3"):
    """A kernel manager for one notebook, with the book's kernel config."""
    from jupyter_client.manager import KernelManager

    return KernelManager(kernel_name=kernel_name, config=kernel_config())


def run_alone(path: str | Path, env: dict[str, str] | None = None):
    """Execute a notebook (.ipynb) as a learner runs it: copied into an empty folder, offline,
    with the project's own kernel, and `env` set in the kernel's environment (the tests
    simulate other machines with it). Returns (executed notebook or None, seconds, error)."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.pop("MPLBACKEND", None)               # as in Jupyter: the inline backend draws
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / Path(path).name
        shutil.copy(path, copy)
        notebook = nbformat.read(copy, as_version=4)
        kernel = kernel_manager(notebook.metadata.get("kernelspec", {}).get("name", ""))
        command = kernel.format_kernel_cmd()
        if command[0] != sys.executable:
            return None, 0.0, (f"the kernel runs {command[0]}, not this project's "
                               f"{sys.executable}")
        if sorted(os.listdir(folder)) != [copy.name]:
            return None, 0.0, f"the folder is not empty: {os.listdir(folder)}"
        start = time.perf_counter()
        try:
            NotebookClient(notebook, km=kernel, timeout=TIMEOUT, allow_errors=False,
                           resources={"metadata": {"path": folder}}).execute()
        except Exception as error:      # noqa: BLE001 — the error is the finding
            return None, time.perf_counter() - start, f"{type(error).__name__}: {error}"
        finally:
            if kernel.has_kernel:       # a kernel we passed in is ours to stop
                kernel.shutdown_kernel(now=True)
        return notebook, time.perf_counter() - start, None


def _execute_one(path: str, warm: str | None = None) -> tuple[str, float, str | None, dict | None]:
    """Execute one notebook in a temporary folder; return (path, seconds, error, notebook).
    `warm`: the socket of a warm server (scripts/warm_kernels.py) that forks the kernel."""
    from jupyter_cache.executors.utils import single_nb_execution
    from jupyter_cache.readers import get_reader

    notebook = get_reader(READER)(path)
    # The kernel inherits this environment: with MPLBACKEND=Agg (common in CI) plt.show() draws
    # nothing and the pages lose their figures. Jupyter's inline backend puts them in the output.
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    with tempfile.TemporaryDirectory() as cwd:
        if warm:
            return (path, *_execute_warm(notebook, cwd, warm))
        # "immediate": once the last cell's outputs are in, stop the kernel at once. A graceful
        # stop lets a kernel that has imported torch tear itself down first: 2 s per notebook.
        result = single_nb_execution(notebook, cwd=cwd, timeout=TIMEOUT, allow_errors=False,
                                     shutdown_kernel="immediate", config=kernel_config())
    if result.err is not None:
        return path, result.time, result.exc_string or repr(result.err), None
    return path, result.time, None, notebook


def _execute_warm(notebook, cwd: str, warm: str) -> tuple[float, str | None, dict | None]:
    """What jupyter-cache's single_nb_execution does, with a kernel forked by the warm server:
    (seconds, error, executed notebook). The kernel and its client are stopped at the end, at
    once ("immediate"), as nbclient stops a kernel it started itself."""
    import traceback

    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    import warm_kernels

    # record_timing=False: as single_nb_execution. Timings in the cells' metadata would change
    # jupyter-cache's key, and Sphinx, not finding the outputs, would run the notebook again.
    client = NotebookClient(notebook, km=warm_kernels.kernel_manager(warm, kernel_config()),
                            timeout=TIMEOUT, allow_errors=False, shutdown_kernel="immediate",
                            record_timing=False, resources={"metadata": {"path": cwd}})
    start = time.perf_counter()
    try:
        client.execute(cleanup_kc=True)
    except (CellExecutionError, CellTimeoutError):
        return time.perf_counter() - start, traceback.format_exc(), None
    return time.perf_counter() - start, None, notebook


def failing_cell(notebook_path: Path, traceback: str) -> str:
    """Say which cell failed, by its line in the .md: nbclient quotes the cell's source."""
    quoted = traceback.split("------------------")
    if len(quoted) >= 2:
        failed = quoted[1].strip()
        text = notebook_path.read_text(encoding="utf-8")
        for probe in (failed, failed.splitlines()[0] if failed else ""):
            if probe and probe in text:
                line = text[:text.index(probe)].count("\n") + 1
                return f"the code cell at line {line}"
    return "a cell (see the traceback)"


def short_traceback(traceback: str) -> str:
    """The failing cell and its error, without the executor's own frames."""
    marker = "An error occurred while executing the following cell:"
    return traceback[traceback.index(marker):] if marker in traceback else traceback


#: What changes a notebook's outputs besides its code cells. jupyter-cache keys a notebook by
#: its code cells alone, so the build keeps this digest beside each executed copy and runs the
#: notebook again when it differs: the module, the model configs, the pins, the environment.
INPUT_FILES = ("scripts/tx_part4.py", "scripts/tx_model_configs", "measurements",
               "requirements.txt", "requirements-nodeps.txt", "pyproject.toml")
INPUT_PACKAGES = ("torch", "transformers", "numpy", "pandas", "matplotlib", "ipykernel")
INPUT_VARIABLES = ("WHY_SELF_ATTENTION_MACHINE", "ATEN_CPU_CAPABILITY", "PYTHONHASHSEED",
                   "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
STAMPS = BUILD / "executed"          # one file a notebook, touched when it runs: Sphinx re-reads


def inputs_digest(root: Path = ROOT) -> str:
    """One hash of everything besides its code cells that a notebook's outputs depend on."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256(sys.version.encode())
    for name in INPUT_FILES:
        path = root / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.is_dir() or "__pycache__" in file.parts:
                continue
            digest.update(f"\0{file.relative_to(root)}\0".encode())
            digest.update(file.read_bytes() if file.exists() else b"(none)")
    for package in INPUT_PACKAGES:
        try:
            digest.update(f"\0{package} {version(package)}".encode())
        except PackageNotFoundError:
            digest.update(f"\0{package} (none)".encode())
    for variable in INPUT_VARIABLES:
        digest.update(f"\0{variable}={os.environ.get(variable)}".encode())
    return digest.hexdigest()[:20]


def stale_notebooks(cache, paths: list[Path], digest: str) -> list[Path]:
    """The notebooks whose executed copy is missing or was made from other inputs: another code
    cell (jupyter-cache's own key) or another module, config, pin or environment (`digest`)."""
    stale = []
    for path in paths:
        try:
            record = cache.match_cache_notebook(read_for_cache(path))
        except KeyError:
            stale.append(path)
            continue
        if (record.data or {}).get("inputs") != digest:
            stale.append(path)
    return stale


def touch_stamp(stem: str) -> None:
    """Mark a notebook as executed now: its page, and the pages that paste from it, are re-read
    by Sphinx (scripts/executed_pages.py), even when their .md did not change."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    (STAMPS / stem).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n", encoding="utf-8")


def fresh_requested(fresh: bool = False) -> bool:
    """A fresh build: asked for (`--fresh`, or FRESH=1 in the environment, as `make book FRESH=1`
    sets it), or in CI (CI=true) unless FRESH=0 says otherwise (a pull request's workflow
    renders incrementally from its restored execution cache)."""
    if fresh:
        return True
    if os.environ.get("FRESH", "") != "":
        return os.environ["FRESH"].lower() in ("1", "true", "yes")
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def warm_wanted() -> bool:
    """Kernels forked from a warm server (scripts/warm_kernels.py), unless
    WHY_SELF_ATTENTION_WARM=0, or where there is no fork (Windows) or a fork is unsafe once
    libraries are loaded (macOS)."""
    if os.environ.get("WHY_SELF_ATTENTION_WARM", "1").lower() in ("0", "false", "no"):
        return False
    return sys.platform.startswith("linux")


def start_warm():
    """Start the warm server now (it imports for seconds, on a core the build leaves free), or
    None when warm kernels are off. Its environment is the kernels' own."""
    if not warm_wanted():
        return None
    import warm_kernels

    return warm_kernels.Server({**os.environ, "MPLBACKEND": INLINE_BACKEND})


def execute(only: list[str] | None = None, glued: dict | None = None,
            fresh: bool = False, warm=None, render=None) -> dict[str, float]:
    """Execute the notebooks whose inputs changed (all of them when `fresh`), two at a time,
    longest first, into the jupyter-cache that the site renders from. With two notebooks or more
    to run, their kernels are forked from a warm server (`warm`, if the build started one).
    `render(order)`, if given, is called once the cache is ready, with the order in which the
    notebooks should finish; what it returns is told of each notebook executed (`.executed`).

    Returns the seconds of each notebook executed; fills `glued`, if given, with each page's
    glued values (from the cache for the notebooks that did not run)."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    paths = [p for p in notebook_sources() if not only or p.stem in only]
    fresh = fresh_requested(fresh)
    if CACHE.exists() and fresh and not only:
        shutil.rmtree(CACHE)          # a fresh build: nothing of an older one is left
    cache = get_cache(str(CACHE))
    for path in paths:
        try:
            cache.get_project_record(str(path.absolute()))
        except KeyError:                 # each write to the cache's database waits for the disk
            cache.add_nb_to_project(str(path), read_data=READER)
    digest = inputs_digest()
    todo = list(paths) if fresh else stale_notebooks(cache, paths, digest)
    previous = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    # Longest first, by the last build's times; before any build, by size (longer pages run longer).
    todo.sort(key=lambda p: (-previous.get(p.stem, 0.0), -p.stat().st_size))
    workers = max(1, min(len(todo), os.cpu_count() or 1))
    times, errors = {}, []
    start = time.perf_counter()
    if render is not None:
        expected = {p.stem: previous.get(p.stem, p.stat().st_size / 2000) for p in todo}
        render = render(finish_order([p.stem for p in todo], expected, workers))
    if warm is None and len(todo) >= 2:
        warm = start_warm()
    socket_path, kernels = None, "cold kernels"
    if warm is not None:
        if warm.ready():
            socket_path = warm.path
            kernels = f"kernels forked after {time.perf_counter() - warm.started:.1f} s of imports"
        else:
            kernels = f"cold kernels: warm server unavailable, {warm.reason}"
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            runs = [pool.submit(_execute_one, str(path), socket_path) for path in todo]
            for run in concurrent.futures.as_completed(runs):    # as each notebook ends
                path, seconds, error, notebook = run.result()
                stem = Path(path).stem
                times[stem] = round(seconds, 2)
                if error is not None:
                    errors.append(f"notebooks/{stem}.md, {failing_cell(Path(path), error)}:\n"
                                  f"{short_traceback(error)}")
                    print(f"  FAILED {stem:28s} {seconds:6.1f} s")
                    continue
                found = glued_in_notebook(notebook)
                cache.cache_notebook_bundle(
                    CacheBundleIn(notebook, path, data={
                        "execution_seconds": seconds, "inputs": digest,
                        "glued": {key: asdict(value) for key, value in found.items()}}),
                    check_validity=False, overwrite=True)
                touch_stamp(stem)
                if render is not None:
                    render.executed(stem)
                if glued is not None:
                    glued[stem] = found
                print(f"  {stem:35s} {seconds:6.1f} s")
    finally:
        if warm is not None:
            warm.close()
    print(f"executed {len(todo)} of {len(paths)} notebooks in {time.perf_counter() - start:.1f} s "
          f"({workers} at a time, {kernels}); "
          + (f"{len(paths) - len(todo)} unchanged, from the cache" if len(todo) < len(paths)
             else "none from the cache"))
    BUILD.mkdir(exist_ok=True)
    TIMES.write_text(json.dumps({**previous, **times}, indent=1))
    if errors:
        fail("a notebook failed to execute:\n" + "\n".join(errors))
    if glued is not None:
        rest = [p.stem for p in paths if p.stem not in glued]
        if rest:
            glued.update(glued_values(rest))
    return times


# ── glued values ──────────────────────────────────────────────────────────────────────────


@dataclass
class Glued:
    """One glued value as the executed notebook holds it."""
    value: object
    kind: str | None = None   # the kind hint given to tx_part4.show, if any
    tol: float | None = None
    ratio: float | None = None        # a claim (tx.claim): the measured ratio ...
    threshold: float | None = None    # ... and the threshold it must exceed
    values: list | None = None        # a phrase (tx.phrase): the words it may take

    @property
    def margin(self) -> float | None:
        """A claim's ratio ÷ threshold: above 1 it holds; under 2 another machine may flip it."""
        if self.ratio is None or not self.threshold:
            return None
        return self.ratio / self.threshold


def glued_in_notebook(notebook) -> dict[str, Glued]:
    """Every glued key of an executed notebook, with its value parsed back from its text."""
    found = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {})
            if "scrapbook" not in meta:
                continue
            prefix = meta["scrapbook"].get("mime_prefix", "")
            text = output.get("data", {}).get(prefix + "text/plain")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError):
                value = text        # not a literal: a figure or a table glued as a whole
            hint = meta.get("why_self_attention", {})
            found[meta["scrapbook"]["name"]] = Glued(value, hint.get("kind"), hint.get("tol"),
                                                     hint.get("ratio"), hint.get("threshold"),
                                                     hint.get("values"))
    return found


def glued_values(only: list[str] | None = None) -> dict[str, dict[str, Glued]]:
    """Glued values of every executed notebook in the cache (or those named), by page."""
    from jupyter_cache import get_cache

    if not CACHE.exists():
        fail("no executed notebooks: run `make book` (or `python scripts/book.py execute`) first")
    cache = get_cache(str(CACHE))
    pages = {}
    for path in notebook_sources():
        if only and path.stem not in only:
            continue
        try:
            record = cache.match_cache_notebook(read_for_cache(path))
        except KeyError:
            fail(f"notebooks/{path.name} has no executed copy in the cache, or the copy is stale: "
                 f"run `make book`")
        saved = (record.data or {}).get("glued")
        if saved is not None:            # read from the outputs when the notebook was executed
            pages[path.stem] = {key: Glued(**value) for key, value in saved.items()}
        else:
            _, notebook = cache.merge_match_into_notebook(read_for_cache(path))
            pages[path.stem] = glued_in_notebook(notebook)
    return pages


# ── expectations ──────────────────────────────────────────────────────────────────────────


def load_expected(path: Path = NUMBERS) -> dict[str, dict[str, dict]]:
    """numbers.toml: {page: {key: {kind, value, tol?, published?, meaning?}}}."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for page, keys in data.items():
        for key, entry in keys.items():
            if entry.get("kind") not in KINDS:
                fail(f"numbers.toml [{page}] {key}: kind must be one of {KINDS}, got {entry.get('kind')!r}")
    return data


def toml_value(value) -> str:
    """A bool, int, float, str or list of them written as TOML."""
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                         ("inf" if value > 0 else "-inf"))
    return json.dumps(str(value), ensure_ascii=False)


def toml_key(key: str) -> str:
    """A TOML key, quoted unless it is bare."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def dump_expected(data: dict[str, dict[str, dict]]) -> str:
    """numbers.toml as text: one line per key, pages in order, keys in the order glued."""
    lines = [
        "# The expected value of every number the book glues: one line per key, one table per page.",
        "# kind: exact (counts) | close (floats, relative tol) | seeded (random but seeded, tol)",
        "#       | measured (machine-dependent: a number, or with `values` a phrase that must be one",
        "#         of them) | recorded (from a committed GPU record: checked to be a number).",
        "# threshold: a claim (tx.claim), an exact boolean that holds while its measured ratio",
        "#         exceeds the threshold; the ledger shows the ratio. published: the value the",
        "#         companion articles print, if any.",
        "# Update with `make numbers`, which shows the diff. meaning/published/kind/tol are kept.",
    ]
    for page in sorted(data):
        lines.append("")
        lines.append(f"[{toml_key(page)}]")
        for key, entry in data[page].items():
            fields = ", ".join(f"{name} = {toml_value(entry[name])}"
                               for name in ("kind", "value", "values", "threshold", "tol",
                                            "published", "meaning")
                               if entry.get(name) is not None)
            lines.append(f"{toml_key(key)} = {{ {fields} }}")
    return "\n".join(lines) + "\n"


# ── the check ─────────────────────────────────────────────────────────────────────────────


@dataclass
class Problem:
    """One row of the drift table."""
    page: str
    key: str
    kind: str
    expected: object
    got: object
    reason: str
    margin: str = ""          # a claim's "ratio / threshold", where the value is a claim


def significant(text: str) -> int:
    """Significant digits written in a published number, e.g. '0.133' → 3, '3.28e-05' → 3."""
    mantissa = text.lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    return max(1, len(mantissa.rstrip("0")) if "." not in text else len(mantissa))


def agrees_with_published(value, published) -> bool:
    """Does the built value, rounded as the companion article rounds it, give the printed number?"""
    if isinstance(published, (bool, str)) or isinstance(value, (bool, str)):
        return value == published
    if isinstance(published, int) and isinstance(value, int):
        return value == published
    digits = significant(repr(published))
    return float(f"{float(value):.{digits}g}") == float(f"{float(published):.{digits}g}")


def is_number(value) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def claim_margin(glued: Glued | None) -> str:
    """A claim's ratio and threshold as the drift table and the ledger show them."""
    if glued is None or glued.margin is None:
        return ""
    return f"{glued.ratio:.3g} / {glued.threshold:.3g} = {glued.margin:.2f}"


#: Which releases the build runs on: unset (or "pinned") for the pins; "newest" in the weekly
#: workflow (`make newest`); `make compat` sets "lowest" or "colab" in its own environments.
RELEASES = "WHY_SELF_ATTENTION_RELEASES"
#: Glued keys that name the torch or transformers release a page ran on ("in transformers
#: 5.24.0"). Off the pins they differ by design: each must be a version string, not the pin.
RELEASE_KEY = re.compile(r"(^|_)(transformers|torch)_version$")


def on_the_pins(environ=None) -> bool:
    """Does this build run on the pinned releases (WHY_SELF_ATTENTION_RELEASES unset)?"""
    return (os.environ if environ is None else environ).get(RELEASES, "pinned") == "pinned"


def compare_one(page: str, key: str, entry: dict, value, glued: Glued | None = None) -> Problem | None:
    """Check one glued value against its expectation. Off the pins, a release name is checked to
    be a version string, not compared (every caller, the build's, the tests' and compat's)."""
    kind, expected = entry["kind"], entry.get("value")
    problem = lambda reason: Problem(page, key, kind, expected, value, reason,  # noqa: E731
                                     claim_margin(glued))
    if RELEASE_KEY.search(key) and not on_the_pins():
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", str(value)):
            return problem("not a version string")
        return None
    if kind in ("measured", "recorded"):
        allowed = entry.get("values")
        if allowed is not None:
            if value not in allowed:
                return problem(f"a phrase must be one of {allowed}")
            return None
        if not is_number(value):
            return problem(f"a {kind} value must be a finite number (a phrase needs `values`)")
        return None
    if kind == "exact":
        if type(value) is not type(expected) or value != expected:
            return problem("drifted")
    else:
        if not (is_number(value) and is_number(expected)):
            return problem("not a number")
        tol = entry.get("tol") or DEFAULT_TOL[kind]
        if not math.isclose(value, expected, rel_tol=tol, abs_tol=tol * 1e-12):
            return problem(f"drifted beyond rel. tol {tol:g}")
    threshold = entry.get("threshold")
    if threshold is not None and (glued is None or glued.threshold != threshold):
        return problem(f"a claim with threshold {threshold:g} in numbers.toml, glued with "
                       f"{'none' if glued is None or glued.threshold is None else f'{glued.threshold:g}'}")
    published = entry.get("published")
    if published is not None and kind in ("exact", "close") and not agrees_with_published(value, published):
        return Problem(page, key, kind, published, value, "disagrees with the companion articles")
    return None


def compare(expected: dict[str, dict[str, dict]], glued: dict[str, dict[str, Glued]]) -> list[Problem]:
    """Every drift, every missing key, every glued key without an expectation."""
    problems = []
    for page in sorted(set(expected) | set(glued)):
        want, have = expected.get(page, {}), glued.get(page)
        if have is None:
            problems.append(Problem(page, "*", "-", f"{len(want)} keys", None, "page not executed"))
            continue
        for key, entry in want.items():
            if key not in have:
                problems.append(Problem(page, key, entry["kind"], entry.get("value"), None,
                                        "missing: expected but not glued"))
            else:
                found = compare_one(page, key, entry, have[key].value, have[key])
                if found:
                    problems.append(found)
        for key in have:
            if key not in want:
                problems.append(Problem(page, key, "-", None, have[key].value,
                                        "unexpected: glued but not in numbers.toml (run `make numbers`)"))
    return problems


def fmt(value) -> str:
    """A value as the drift table shows it."""
    if value is None:
        return "—"
    if isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def problem_table(problems: list[Problem]) -> str:
    """The drift table, one row per problem, readable in a terminal."""
    rows = [("page", "key", "kind", "expected", "got", "ratio / threshold", "what")]
    rows += [(p.page, p.key, p.kind, fmt(p.expected), fmt(p.got), p.margin or "—", p.reason)
             for p in problems]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check_numbers(only: list[str] | None = None, glued: dict | None = None) -> None:
    """Compare the build's glued values with numbers.toml; fail with a table of every problem."""
    expected, glued = load_expected(), glued if glued is not None else glued_values(only)
    if only:
        expected = {page: keys for page, keys in expected.items() if page in only}
    problems = compare(expected, glued)
    total = sum(len(keys) for keys in glued.values())
    if problems:
        write_step_summary(problems, total)     # in a workflow: the same table in the job summary
        fail(f"number check: {len(problems)} problem(s) in {total} glued values\n"
             f"{problem_table(problems)}\n"
             f"If a change is on purpose, run `make numbers`, read the diff, and say so in the commit.")
    print(f"numbers: {total} glued values on {len(glued)} pages match numbers.toml")
    if not on_the_pins():
        print(f"  ({RELEASES}={os.environ[RELEASES]}: the release names each page glues were "
              f"checked to be versions, not compared with the pins)")


def accept_numbers(only: list[str] | None = None) -> None:
    """Write the build's glued values into numbers.toml, keeping kinds, published values and meanings."""
    old = load_expected()
    new: dict[str, dict[str, dict]] = {page: keys for page, keys in old.items()
                                       if only and page not in only}
    for page, keys in glued_values(only).items():
        new[page] = {}
        for key, glued in keys.items():
            entry = dict(old.get(page, {}).get(key, {}))
            entry.setdefault("kind", glued.kind or ("close" if isinstance(glued.value, float) else "exact"))
            if glued.tol is not None and "tol" not in entry:
                entry["tol"] = glued.tol
            if glued.values is not None:
                entry["values"] = list(glued.values)      # a phrase: the words it may take
            if glued.threshold is not None:
                entry["threshold"] = glued.threshold      # a claim: the threshold it must exceed
            entry["value"] = glued.value
            new[page][key] = entry
    before = NUMBERS.read_text(encoding="utf-8") if NUMBERS.exists() else ""
    after = dump_expected(new)
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(),
                                     "numbers.toml (before)", "numbers.toml (after)", lineterm=""))
    NUMBERS.write_text(after, encoding="utf-8")
    print("\n".join(diff) if diff else "numbers.toml: no change")


# ── the ledger ────────────────────────────────────────────────────────────────────────────


def default_meaning(key: str) -> str:
    """A table cell's key says where it is: name.row.column."""
    parts = key.split(".")
    if len(parts) == 3:
        return f"table `{parts[0]}`, row {parts[1]}, column {parts[2].replace('_', ' ')}"
    return ""


def inline_html(text: str) -> str:
    """Plain text as HTML, with `backticks` set as code, as MyST would set them."""
    parts = html_module.escape(text).split("`")
    return "".join(f'<code class="docutils literal notranslate">{part}</code>' if i % 2 else part
                   for i, part in enumerate(parts))


LEDGER_COLUMNS = (("key", "left"), ("meaning", "left"), ("kind", "left"), ("tolerance", "right"),
                  ("published", "right"), ("this build", "right"), ("ratio / threshold", "right"),
                  ("status", "left"))


def ledger_table(rows: list[list[str]]) -> list[str]:
    """One page's rows as a raw HTML table, styled as the theme styles a Markdown table.

    Raw HTML, not a Markdown table: Sphinx turns each of about 800 Markdown rows into a tree of
    nodes, and that cost 4 s of every build on a 2-core machine; raw HTML passes through.
    """
    head = "".join(f'<th class="head" style="text-align: {align}">{name}</th>'
                   for name, align in LEDGER_COLUMNS)
    body = ["<tr>" + "".join(f'<td style="text-align: {align}">{inline_html(cell)}</td>'
                             for cell, (_, align) in zip(row, LEDGER_COLUMNS)) + "</tr>"
            for row in rows]
    return ["```{raw} html", '<div class="pst-scrollable-table-container">',
            '<table class="table ledger">', f"<thead><tr>{head}</tr></thead>", "<tbody>",
            *body, "</tbody></table></div>", "```"]


def claims_summary(glued: dict[str, dict[str, Glued]]) -> str:
    """How many claims this build made, and how many have a margin under 2."""
    margins = [g.margin for keys in glued.values() for g in keys.values() if g.margin is not None]
    close = sum(1 for m in margins if m < 2)
    return (f"{len(margins)} claims, {close} of them with a margin under 2"
            if margins else "no claims")


def ledger_text(expected: dict[str, dict[str, dict]], glued: dict[str, dict[str, Glued]]) -> str:
    """The ledger page: every checked number, its meaning, kind, tolerance, published value, build value,
    status."""
    problems = {(p.page, p.key): p.reason for p in compare(expected, glued)}
    lines = [
        "# The ledger",
        "",
        "Every number this book checks, one row each. The page is generated by `make book` from",
        "`numbers.toml` and the notebooks it has just executed; nobody types it. *Published* is",
        "the value printed in the companion articles, where they print one. *This build* is the value",
        "the notebook glued in this build. *Status* is the number check's verdict.",
        "",
        "Kinds: **exact** must match to the last digit; **close** and **seeded** within the",
        "relative tolerance shown; **measured** values come from this machine's clock and are only",
        "checked to be numbers, while the relations between them are checked as exact booleans;",
        "**recorded** values come from a committed measurement made on another machine (a GPU),",
        "labelled on the page with its device and date, and are checked to be there. A measured",
        "*phrase* (\"faster than\" or \"slower than\") is the words a sentence takes from this",
        "machine's clock: it must be one of the phrases its key allows.",
        "",
        "A *claim* is an exact boolean measured on this machine that the argument rests on. It",
        "holds while its measured ratio exceeds its threshold; the column *ratio / threshold*",
        "shows both and their quotient, the margin. A margin under 2 (marked ⚠) is close enough",
        "to flip on another machine. This build has "
        + claims_summary(glued) + ".",
    ]
    for page in sorted(expected):
        rows = []
        for key, entry in expected[page].items():
            kind = entry["kind"]
            tol = entry.get("tol") or DEFAULT_TOL.get(kind)
            have = glued.get(page, {}).get(key)
            status = problems.get((page, key), "ok")
            margin = claim_margin(have)
            if margin and have.margin < 2:
                margin = "⚠ " + margin
            rows.append([f"`{key}`", entry.get("meaning") or default_meaning(key), kind,
                         f"{tol:g}" if tol else "—", fmt(entry.get("published")),
                         fmt(have.value if have else None), margin or "—",
                         "✅ ok" if status == "ok" else f"❌ {status}"])
        lines += ["", f"## [{page}](../notebooks/{page}.md)", "", *ledger_table(rows)]
    return "\n".join(lines) + "\n"


def write_if_changed(path: Path, text: str) -> str:
    """Write a generated page only when its text changes: Sphinx re-reads a page whose file is
    newer than its last reading. Returns what happened, for the build's log."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return "unchanged"
    path.write_text(text, encoding="utf-8")
    return "written"


def write_ledger(glued: dict | None = None) -> None:
    """Write book/ledger.md for this build (from `glued`, if the caller has read it already)."""
    glued = glued if glued is not None else glued_values()
    print(f"ledger: {rel(LEDGER)} {write_if_changed(LEDGER, ledger_text(load_expected(), glued))}")


# ── the exercises page ───────────────────────────────────────────────────────────────────

EXERCISES = ROOT / "book" / "exercises.md"
EXERCISE = re.compile(r"^```\{exercise\}\s*(?P<title>.*?)\s*\n:label:\s*(?P<label>\S+)", re.M)


def exercises(md: Path) -> list[tuple[str, str]]:
    """(label, title) of every exercise of a notebook, in page order."""
    return [(m["label"], m["title"]) for m in EXERCISE.finditer(md.read_text(encoding="utf-8"))]


def page_title(md: Path) -> str:
    """A notebook's title: its first heading outside code cells (a `# ` line in a code cell is a
    comment, such as the Colab cell's first line)."""
    for cell in read_md(md).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if re.match(r"#\s+\S", line):
                    return line.lstrip("#").strip()
    return md.stem


def exercises_text() -> str:
    """The exercises page: each part's exercises under the part's title, each by its number
    (a link) and its title."""
    lines = ["# Exercises", "",
             "Every part ends with exercises. Each solution runs when the book is built, and every",
             "number it prints is checked like the rest of the book (the keys that start with `ex_`",
             "in the [ledger](ledger.md)). On the pages the solutions are collapsed: try first.", ""]
    for md in notebook_sources():
        found = exercises(md)
        if not found:
            continue
        lines += [f"## [{page_title(md)}](../notebooks/{md.stem}.md)", ""]
        lines += [f"- {{numref}}`{label}`" + (f": {title}" if title else "")
                  for label, title in found]
        lines.append("")
    return "\n".join(lines)


def write_exercises() -> None:
    """Write book/exercises.md from the notebooks' exercise directives."""
    print(f"exercises: {rel(EXERCISES)} {write_if_changed(EXERCISES, exercises_text())}")


# ── in a workflow: the site names the workflow's repository, a failure fills the summary ──

#: _config.yml as the site's render reads it when the site names another repository.
SITE_CONFIG = BUILD / "_config.site.yml"


def site_repository_url(environ=None) -> str:
    """The repository the site's launch and repository buttons name.

    In a GitHub Actions workflow, the workflow's own (GITHUB_REPOSITORY): a fork's site opens the
    fork's notebooks, with no edit. Elsewhere, the one _config.yml names."""
    environ = os.environ if environ is None else environ
    name = environ.get("GITHUB_REPOSITORY", "").strip().strip("/")
    return f"https://github.com/{name}" if name else repository_url()


def site_config_option(environ=None) -> list[str]:
    """`--config FILE` for `jupyter-book build` when the site names another repository than
    _config.yml (FILE: _config.yml with that repository.url); no option otherwise.

    Jupyter Book 1 takes no single-key override on its command line, and reads the buttons'
    repository from repository.url; _config.yml itself keeps the default for local builds.
    Jupyter Book resolves local_extensions against the config file's folder: written absolute."""
    import yaml

    url = site_repository_url(environ)
    if url == repository_url():
        return []
    config = book_config()
    config["repository"]["url"] = url
    extensions = config.get("sphinx", {}).get("local_extensions") or {}
    for name, folder in extensions.items():
        extensions[name] = str((ROOT / folder).resolve())
    SITE_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    SITE_CONFIG.write_text("# Written by scripts/book.py html: _config.yml, with the repository of "
                           "the workflow (GITHUB_REPOSITORY).\n"
                           + yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
                           encoding="utf-8")
    print(f"site: the buttons name {url} (GITHUB_REPOSITORY), not {repository_url()}")
    return ["--config", str(SITE_CONFIG)]


def markdown_cell(text: str) -> str:
    """Text for one cell of a Markdown table: no bar or line break can end the cell early."""
    return " ".join(str(text).split()).replace("|", "\\|") or " "


def markdown_problem_table(problems: list[Problem]) -> str:
    """The drift table as GitHub-flavoured Markdown: the same columns as problem_table."""
    rows = [("page", "key", "kind", "expected", "got", "ratio / threshold", "what"),
            ("---",) * 7]
    rows += [(p.page, f"`{p.key}`", p.kind, fmt(p.expected), fmt(p.got), p.margin or "—", p.reason)
             for p in problems]
    return "\n".join("| " + " | ".join(markdown_cell(c) if i > 1 else c for c in row) + " |"
                     for i, row in enumerate(rows))


def write_step_summary(problems: list[Problem], total: int, environ=None) -> None:
    """In a GitHub Actions job (GITHUB_STEP_SUMMARY is set): append the drift table to the job's
    summary, so the failure reads on the run's page. Elsewhere: nothing (the terminal has the
    table already)."""
    environ = os.environ if environ is None else environ
    summary = environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    text = (f"### Number check: {len(problems)} problem(s) in {total} glued values\n\n"
            f"{markdown_problem_table(problems)}\n\n"
            "If a change is on purpose, run `make numbers`, read the diff, and say so in the "
            "commit.\n\n")
    with open(summary, "a", encoding="utf-8") as out:
        out.write(text)


# ── the site ──────────────────────────────────────────────────────────────────────────────


def html_command(fresh: bool = False) -> list[str]:
    """The jupyter-book command that renders the site (`fresh`: every page, an empty folder)."""
    # jupyter-book's command line, run by scripts/render.py: the same command, without the
    # 0.9 s that Python spends freeing the render's memory before the process ends
    command = [sys.executable, str(ROOT / "scripts" / "render.py"), "build", str(ROOT),
               "--builder", "html", "-W", "-n", "--keep-going"]
    command += site_config_option()      # in a workflow: the buttons name its repository
    if fresh_requested(fresh):
        command.append("--all")
        shutil.rmtree(BUILD / "html", ignore_errors=True)   # no page left from an older build
    print("$ jupyter-book", " ".join(command[2:]))
    return command


def html_result(returncode: int, stdout: str, stderr: str) -> None:
    """Fail on a render that failed, naming its warnings, or that executed a notebook itself
    (myst-nb runs a notebook whose outputs it does not find in the cache: slowly, with another
    kernel, and unchecked); else say how many pages were read."""
    warnings = [line for line in (stdout + stderr).splitlines()
                if re.search(r"(WARNING|ERROR|CRITICAL)", line)]
    executed = sorted({rel(Path(name)) for name in re.findall(
        r"([\w/.-]+\.md)\S*: Executing notebook", stdout + stderr)})
    if returncode == 0 and (executed or "Executing notebook" in stdout + stderr):
        fail("the HTML build executed notebooks itself, not finding their outputs in the cache: "
             + (", ".join(executed) or "see the log") + "\n(the build's execution and "
             "jupyter-cache's key disagree: a cell's metadata, its source, or the kernelspec)")
    if returncode != 0:
        # Sphinx warns about a page only while it reads or writes it: forget every reading,
        # so that the next build reads every page again and cannot pass on a warned page.
        (BUILD / ".doctrees" / "environment.pickle").unlink(missing_ok=True)
        tail = "\n".join((stdout + stderr).splitlines()[-40:])
        fail("the HTML build failed" + (":\n  " + "\n  ".join(warnings) if warnings else "") +
             f"\n--- last lines of jupyter-book ---\n{tail}")
    read = re.search(r"(\d+) added, (\d+) changed", stdout)
    pages = f"{int(read[1]) + int(read[2])} page(s) read again" if read else "pages read"
    print(f"site: {rel(BUILD / 'html' / 'index.html')} ({pages})")


def html(fresh: bool = False) -> None:
    """Render the site from the executed cache: warnings and broken references are errors.

    Sphinx re-reads only the pages that changed: an edited .md, a notebook executed again (its
    stamp, scripts/executed_pages.py), a generated page whose text changed. `fresh` renders
    every page into an empty folder."""
    done = subprocess.run(html_command(fresh), cwd=ROOT, capture_output=True, text=True)
    html_result(done.returncode, done.stdout, done.stderr)


class RenderAlongside:
    """The render as `make book` runs it: Sphinx starts with the build and does what it can
    while the rest of the build runs. It waits where it must through scripts/executed_pages.py,
    which watches a folder of signals.

    - Sphinx starts early: its imports and the last build's environment load while the pairs
      are checked (in a fresh build, while the kernels' libraries are imported). It then waits
      for `go`: the pages it will find are written.
    - A fresh build says `go` before the notebooks run. Sphinx reads the pages that need no
      outputs, then each notebook's page as soon as its outputs are in the cache (a file named
      after the notebook), in the order the notebooks should finish (`order`), and last the
      pages written from the outputs (`last`: the ledger), once they are written (`all`). The
      last notebook runs alone on one core; Sphinx reads on the other.
    - Any other build says `go` once the notebooks that changed have run and the ledger is
      written. Sphinx then finds the pages that changed as it always does.
    - `stop`: the build failed; the render stops too."""

    def __init__(self, fresh: bool):
        self.signals = Path(tempfile.mkdtemp(prefix="render-signals-"))
        # the pages written from the outputs: read once they are written
        (self.signals / "last").write_text(LEDGER.relative_to(ROOT).with_suffix("").as_posix()
                                           + "\n", encoding="utf-8")
        # Sphinx's stdout and stderr: files, not pipes (a full pipe would stop Sphinx while the
        # build runs the notebooks); closed by finish() or stop()
        self.output = [tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
                       for _ in range(2)]
        env = {**os.environ, RENDER_SIGNALS: str(self.signals)}
        self.process = subprocess.Popen(html_command(fresh), cwd=ROOT, env=env,
                                        stdout=self.output[0], stderr=self.output[1], text=True)
        # Sphinx yields to the kernels: the pages time code, and a page read in the middle of
        # a measurement would take part of its core. It reads when a core is free (between
        # notebooks, beside the last one), and runs alone, at full speed, once they are done.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, self.process.pid, RENDER_NICENESS)

    def go(self, order: list[str] | None = None) -> None:
        """The pages Sphinx will find are written; `order`: the notebooks are about to run, and
        should finish in this order (their pages wait for them)."""
        if order is not None:
            (self.signals / "order").write_text("\n".join(order) + "\n", encoding="utf-8")
        (self.signals / "go").touch()

    def executed(self, stem: str) -> None:
        """A notebook's outputs are in the cache: Sphinx may read its page."""
        (self.signals / stem).touch()

    def finish(self) -> None:
        """Every output and generated page is written: wait for the render, judge it."""
        (self.signals / "go").touch()
        (self.signals / "all").touch()
        code = self.process.wait()
        stdout, stderr = (self._read(out) for out in self.output)
        shutil.rmtree(self.signals, ignore_errors=True)
        html_result(code, stdout, stderr)

    def stop(self) -> None:
        """The build failed before the render could finish: end it."""
        if self.process.poll() is None:
            (self.signals / "stop").touch()
            self.process.kill()
            self.process.wait()
        for out in self.output:
            out.close()
        shutil.rmtree(self.signals, ignore_errors=True)

    @staticmethod
    def _read(out) -> str:
        out.seek(0)
        text = out.read()
        out.close()
        return text


def finish_order(stems: list[str], seconds: dict[str, float], workers: int) -> list[str]:
    """The order in which notebooks started in this order on `workers` should finish, by the
    expected `seconds` of each."""
    free = [0.0] * max(1, workers)
    ends = []
    for stem in stems:
        at = min(range(len(free)), key=free.__getitem__)
        free[at] += seconds.get(stem, 1.0)
        ends.append((free[at], stem))
    return [stem for _, stem in sorted(ends)]


def claims_near_threshold(glued: dict[str, dict[str, Glued]]) -> list[str]:
    """One line per claim whose margin (ratio ÷ threshold) is under 2, smallest margin first: the
    claims that another machine may flip. Not a warning: the check passed; a maintainer reads it."""
    close = sorted((g.margin, key, page) for page, keys in glued.items()
                   for key, g in keys.items() if g.margin is not None and g.margin < 2)
    return [f"claims near their threshold: {key} ({page}) {margin:.2f}"
            for margin, key, page in close]


def budget_report(times: dict[str, float], total: float, fresh: bool = True,
                  phases: dict[str, float] | None = None) -> list[str]:
    """The build's closing lines: the seconds of each notebook executed and the total, against
    the budget (the whole build's budget is a fresh build's: an edit runs fewer notebooks).
    Over budget is a WARNING line naming the notebook, never a failure: machines vary."""
    over = lambda seconds, budget: "  OVER BUDGET" if seconds >= budget else ""  # noqa: E731
    lines = [f"build times (budget: each notebook < {BUDGET_NOTEBOOK:g} s, "
             f"a fresh build < {BUDGET_BUILD:g} s):"]
    lines += [f"  {stem:35s} {seconds:6.1f} s{over(seconds, BUDGET_NOTEBOOK)}"
              for stem, seconds in sorted(times.items())]
    if phases:
        lines.append("  where the build's time went: " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in phases.items()))
    whole = "whole build" if fresh else f"whole build ({len(times)} executed)"
    lines.append(f"  {whole:35s} {total:6.1f} s{over(total, BUDGET_BUILD) if fresh else ''}")
    lines += [f"WARNING: notebooks/{stem}.md took {seconds:.1f} s, over the budget of "
              f"{BUDGET_NOTEBOOK:g} s for one notebook" for stem, seconds in sorted(times.items())
              if seconds >= BUDGET_NOTEBOOK]
    if fresh and total >= BUDGET_BUILD:
        lines.append(f"WARNING: the build took {total:.1f} s, over its budget of {BUDGET_BUILD:g} s")
    return lines


def build(fresh: bool = False) -> None:
    """Everything `make book` does: pairs, execution of what changed, ledger, site, number check
    over every page, the claims near their threshold, the times."""
    start = time.perf_counter()
    fresh = fresh_requested(fresh)
    # A fresh build imports the kernels' libraries while the pairs are checked, and Sphinx
    # starts after the check: the import is what the notebooks wait for, so it has a core to
    # itself. Any other build starts Sphinx at once (its imports are what the build waits for).
    warm = start_warm() if fresh else None
    render = None if fresh else RenderAlongside(fresh)
    try:
        check_sync()
        render = render or RenderAlongside(fresh)
        write_exercises()                      # from the .md files alone: before Sphinx reads
        phases = {"pairs": time.perf_counter() - start}
        glued: dict[str, dict[str, Glued]] = {}

        def notebooks_start(order: list[str]) -> RenderAlongside:
            if not LEDGER.exists():       # a fresh clone: Sphinx must find the page it lists
                LEDGER.write_text("# Ledger\n\nWritten once the notebooks have run.\n",
                                  encoding="utf-8")
            render.go(order)
            return render

        # every page's glue: the ledger and the check
        times = execute(glued=glued, fresh=fresh, warm=warm,
                        render=notebooks_start if fresh else None)
        phases["execution"] = time.perf_counter() - start - sum(phases.values())
        write_ledger(glued)
        render.finish()
    except BaseException:
        if render is not None:
            render.stop()
        if warm is not None:
            warm.close()
        raise
    phases["site"] = time.perf_counter() - start - sum(phases.values())
    check_numbers(glued=glued)
    phases["number check"] = time.perf_counter() - start - sum(phases.values())
    for line in claims_near_threshold(glued):
        print(line)
    print("\n".join(budget_report(times, time.perf_counter() - start, fresh, phases)))
    print(f"make book: {time.perf_counter() - start:.1f} s in all")


def main(argv: list[str] | None = None) -> int:
    """Run one command; print a clear message and return 1 on a failure."""
    commands = {"build": build, "check-sync": check_sync, "sync": sync, "execute": execute,
                "check-numbers": check_numbers, "numbers": accept_numbers, "ledger": write_ledger,
                "exercises": write_exercises, "html": html}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=commands)
    parser.add_argument("pages", nargs="*", help="execute, numbers, check-numbers: only these "
                        "notebooks (stems such as 02_sequential_steps)")
    parser.add_argument("--fresh", action="store_true", help="build, execute, html: execute "
                        "every notebook and render every page (also when CI=true)")
    args = parser.parse_args(argv)
    try:
        if args.command == "execute":
            execute(args.pages or None, fresh=args.fresh)
        elif args.pages and args.command in ("numbers", "check-numbers"):
            commands[args.command](args.pages)
        elif args.command in ("build", "html"):
            commands[args.command](fresh=args.fresh)
        else:
            commands[args.command]()
    except BuildError as error:
        print(f"\nmake book FAILED ({args.command}): {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
