"""Stage 5, the site: one plain `jupyter-book build` renders the pages
from the cache (myst-nb's `execute_notebooks: cache`), warnings as
errors. Sphinx never executes: the build fails first if a page is not
cached, and after if the cache changed all the same."""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from bookbuild.common import BUILD, CACHE, ROOT, fail, rel
from bookbuild.execute import require_executed


def cache_state() -> str:
    """A hash of the executed copies' keys and times of making."""
    from jupyter_cache import get_cache

    records = get_cache(str(CACHE)).list_cache_records()
    keys = sorted(f"{r.hashkey}@{r.created.isoformat()}" for r in records)
    return hashlib.sha256(" ".join(keys).encode()).hexdigest()[:20]


def render(builder: str = "html", fresh: bool = False) -> None:
    """Render the site; a warning or broken reference fails, named. When
    the cache changed since the last render, Sphinx reads every page (a
    page pastes values of others); else only the pages whose files
    changed."""
    require_executed()
    if fresh:
        shutil.rmtree(BUILD / builder, ignore_errors=True)
    state, mark = cache_state(), BUILD / builder / ".cache-state"
    changed = not mark.exists() or mark.read_text(encoding="utf-8") != state
    command = [str(Path(sys.executable).with_name("jupyter-book")), "build",
               str(ROOT), "--builder", builder, "-W", "-n", "--keep-going"
               ] + (["--all"] if fresh or changed else [])
    print("$ jupyter-book", " ".join(command[1:]))
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    output = done.stdout + done.stderr
    log = BUILD / f"jupyter-book-{builder}.log"
    log.write_text(output, encoding="utf-8")
    if done.returncode != 0 or cache_state() != state:
        mark.unlink(missing_ok=True)    # the next render reads every page
    if done.returncode != 0:
        warnings = [line for line in output.splitlines()
                    if "WARNING" in line or "ERROR" in line]
        fail(f"the {builder} build failed:\n  " + "\n  ".join(warnings)
             + f"\n--- last lines of jupyter-book (all: {rel(log)}) ---\n"
             + "\n".join(output.splitlines()[-30:]))
    if cache_state() != state:          # myst-nb executed: its key drifted
        fail("Sphinx executed a notebook itself (myst-nb found no copy "
             f"in the cache under the build's key): see {rel(log)}")
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(state, encoding="utf-8")
    print(f"site: {rel(BUILD / builder)} rendered"
          + (" (every page read: the cache changed)" if changed else ""))
