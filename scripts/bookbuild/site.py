"""Stage 5, the site: one plain `jupyter-book build` renders _build/html
from the cache (myst-nb's `execute_notebooks: cache`), warnings as errors.
Sphinx never executes: the build fails first if a page is not cached."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from bookbuild.common import BUILD, CACHE, ROOT, fail, rel
from bookbuild.execute import require_executed


def jupyter_book(builder: str, fresh: bool) -> list[str]:
    """The jupyter-book command line for `builder` (`fresh`: read every
    page again; pages paste values from other pages)."""
    command = [str(Path(sys.executable).with_name("jupyter-book")), "build",
               str(ROOT), "--builder", builder, "-W", "-n", "--keep-going"]
    return command + (["--all"] if fresh else [])


def cache_state() -> str:
    """One hash of the executed copies in the cache: their keys (the code
    cells) and when each was made (the same code run again)."""
    from jupyter_cache import get_cache

    records = get_cache(str(CACHE)).list_cache_records()
    keys = sorted(f"{r.hashkey}@{r.created.isoformat()}" for r in records)
    return hashlib.sha256(" ".join(keys).encode()).hexdigest()[:20]


def render(builder: str = "html", fresh: bool = False) -> None:
    """Render the site from the cache: a warning or a broken reference
    fails, naming them. Sphinx reads every page again when the cache
    changed since the last render (a page pastes values of others; `make
    test` executes too); else only the pages whose files changed."""
    require_executed()
    if fresh:
        shutil.rmtree(BUILD / builder, ignore_errors=True)
    state, mark = cache_state(), BUILD / builder / ".cache-state"
    changed = not mark.exists() or mark.read_text(encoding="utf-8") != state
    command = jupyter_book(builder, fresh or changed)
    print("$ jupyter-book", " ".join(command[1:]))
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    output = done.stdout + done.stderr
    log = BUILD / f"jupyter-book-{builder}.log"
    log.write_text(output, encoding="utf-8")
    if done.returncode != 0:
        # Sphinx warns about a page only while it reads it: the next
        # render reads every page (--all), so it cannot pass a warned page.
        mark.unlink(missing_ok=True)
        warnings = [line for line in output.splitlines()
                    if "WARNING" in line or "ERROR" in line]
        tail = "\n".join(output.splitlines()[-30:])
        fail(f"the {builder} build failed:\n  " + "\n  ".join(warnings)
             + f"\n--- last lines of jupyter-book (all: {rel(log)}) ---"
             + f"\n{tail}")
    if cache_state() != state:      # myst-nb executed: its key drifted
        mark.unlink(missing_ok=True)
        fail("Sphinx executed a notebook itself (myst-nb found no copy "
             "in the cache under the key the build wrote): see "
             f"{rel(log)}")
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(state, encoding="utf-8")
    print(f"site: {rel(BUILD / builder)} rendered"
          + (" (every page read: the cache changed)" if changed else ""))


def html(fresh: bool = False) -> None:
    """`python scripts/book.py html`: render the site from the cache."""
    render("html", fresh)


