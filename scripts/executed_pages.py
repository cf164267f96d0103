"""Sphinx re-reads a page whose notebook was executed again, even when its .md did not change.

`scripts/book.py execute` runs only the notebooks whose inputs changed and touches a stamp file
for each one it ran (`_build/executed/<stem>`). Sphinx re-reads a page when its source, or a
file the page depends on, is newer than its last reading. So each page depends on stamps:
- a notebook on its own stamp (new outputs, same .md);
- a page that pastes another page's glue (`{glue:text}` `page::key`, the scorecard) on the
  stamps of the pages it pastes from: the pasted values are resolved when the page is written,
  and Sphinx writes only the pages it re-read;
- a page with the execution table (`nb-exec-table`) on every stamp.

`make book` starts Sphinx with the build (book.RenderAlongside), with
WHY_SELF_ATTENTION_RENDER_SIGNALS naming a folder of signals. Sphinx loads, then waits for `go`:
the pages it will find are written. In a fresh build, whose notebooks run while Sphinx reads,
it reads the pages that need no outputs first, then the notebooks' pages in the order they
should finish (`order`), each once its outputs are in the cache (a file named after it), and
last the pages the build writes from the outputs (`last`: the ledger), once it has written them
(`all`). `stop`, or the build's process gone: the build failed, the render stops too.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from sphinx.errors import ExtensionError

#: A glue role or directive that pastes from another page: {glue:text}`notebooks/01_costs::key`.
PASTE = re.compile(r"\{glue(?::\w+)?\}`(?P<page>[^`:]+)::")
EXEC_TABLE = "{nb-exec-table}"


def stamps_folder() -> Path:
    """The folder where book.py keeps the stamps (book.STAMPS; BOOK_BUILD_DIR moves it)."""
    import book

    return book.STAMPS


def stamps_for(docname: str, text: str, folder: Path) -> list[Path]:
    """The stamp files a page depends on (only those that exist: a missing dependency would make
    Sphinx re-read the page on every build)."""
    stems: set[str] = set()
    if docname.startswith("notebooks/"):
        stems.add(docname.split("/", 1)[1])
    stems |= {Path(match["page"]).stem for match in PASTE.finditer(text)}
    if EXEC_TABLE in text:
        stems |= {path.name for path in folder.glob("*")}
    return sorted(folder / stem for stem in stems if (folder / stem).is_file())


def note_stamps(app, docname: str, source: list[str]) -> None:
    """On reading a page: record the stamps it depends on."""
    for stamp in stamps_for(docname, source[0], stamps_folder()):
        app.env.note_dependency(str(stamp))


SIGNALS = "WHY_SELF_ATTENTION_RENDER_SIGNALS"
WAIT_LIMIT = 900.0                   # seconds: longer than any build; then the render fails


#: The build's process: the render stops waiting if it is gone.
BUILD_PROCESS = os.getppid()


def signals() -> Path | None:
    """The folder of signals of a render that runs alongside the build, else None (a render on
    its own, `book.py html`, `jupyter-book build`)."""
    value = os.environ.get(SIGNALS)
    return Path(value) if value else None


def wait_for_go(app) -> None:
    """Once loaded: wait until the pages that Sphinx will find are written."""
    folder = signals()
    if folder is not None:
        wait_for(folder / "go", "the render")


def read_order(app, env, docnames: list[str]) -> None:
    """Read the pages that need no outputs, then the notebooks' in the order their notebooks
    should finish, then the pages written from the outputs."""
    folder = signals()
    if folder is None or not (folder / "order").exists():
        return
    order = (folder / "order").read_text(encoding="utf-8").split()
    rank = {f"notebooks/{stem}": at for at, stem in enumerate(order)}
    last = set((folder / "last").read_text(encoding="utf-8").split())

    def place(name: str) -> tuple:
        if name in last:
            return (2, 0, name)
        return (1, rank[name], "") if name in rank else (0, 0, name)

    docnames.sort(key=place)


def wait_for(signal: Path, docname: str) -> None:
    """Wait until `signal` exists; fail if the build stopped or it never came."""
    start = time.monotonic()
    while not signal.exists():
        if (signal.parent / "stop").exists() or os.getppid() != BUILD_PROCESS:
            raise ExtensionError(f"{docname}: the build stopped before its outputs were ready")
        if time.monotonic() - start > WAIT_LIMIT:
            raise ExtensionError(f"{docname}: no outputs after {WAIT_LIMIT:g} s")
        time.sleep(0.05)


def wait_for_outputs(app, docname: str, source: list[str]) -> None:
    """Before Sphinx reads a page alongside the execution: a notebook's page waits for its
    outputs, a page written from them for the build to write it (and is read again)."""
    folder = signals()
    if folder is None:
        return
    if docname.startswith("notebooks/") and (folder / "order").exists():
        wait_for(folder / docname.split("/", 1)[1], docname)
    elif docname in (folder / "last").read_text(encoding="utf-8").split():
        wait_for(folder / "all", docname)
        source[0] = Path(app.env.doc2path(docname)).read_text(encoding="utf-8")


def setup(app):
    app.connect("builder-inited", wait_for_go, priority=900)       # after the others' setup
    app.connect("env-before-read-docs", read_order)
    app.connect("source-read", wait_for_outputs, priority=100)   # before note_stamps reads it
    app.connect("source-read", note_stamps)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
