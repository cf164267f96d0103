"""Sphinx re-reads a page whose notebook was executed again, even when its .md did not change.

`scripts/book.py execute` runs only the notebooks whose inputs changed and touches a stamp file
for each one it ran (`_build/executed/<stem>`). Sphinx re-reads a page when its source, or a
file the page depends on, is newer than its last reading. So each page depends on stamps:
- a notebook on its own stamp (new outputs, same .md);
- a page that pastes another page's glue (`{glue:text}` `page::key`, the scorecard) on the
  stamps of the pages it pastes from: the pasted values are resolved when the page is written,
  and Sphinx writes only the pages it re-read;
- a page with the execution table (`nb-exec-table`) on every stamp.
"""

from __future__ import annotations

import re
from pathlib import Path

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


def setup(app):
    app.connect("source-read", note_stamps)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
