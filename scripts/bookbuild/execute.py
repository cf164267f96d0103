"""Stage 2, execute: the notebooks run, two at a time, each in an empty
folder, into the jupyter-cache that myst-nb renders from; then their glued
values are read back from the cache.

What is stale. jupyter-cache keys a notebook by its code cells. Everything
else a page's outputs depend on (the module, the model configs, the GPU
records in measurements/, the pins, the installed versions, the simulated
machine) is recorded in one stamp beside the cache, a JSON map of each
input to its hash or version: when one changes, the cache is cleared, every
page runs again, and the message names what changed. Every page imports the
module and the pins, so this is the simplest rule that is correct; a page's
own data (measurements/, the configs) is rare enough to cost a full run.
The kernel's environment is set here (KERNEL_ENV), not taken from make's.
"""

from __future__ import annotations

import ast
import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bookbuild.common import (
    BUILD,
    CACHE,
    ROOT,
    TIMEOUT,
    fail,
    module_constant,
    notebook_sources,
    rel,
)

WORKERS = 2                      # notebooks at a time (the 2-core machine)
STAMP = BUILD / "jupyter_cache.inputs"    # the stamp beside the cache
#: the reader myst-nb uses for a .md: the cache keys what myst-nb looks up
READER = {"name": "myst_nb_md", "type": "plugin"}
#: Jupyter's backend: figures in the outputs, even where MPLBACKEND=Agg
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
#: ipykernel 7.3+ warns on every start of a kernel on plain TCP;
#: jupyter_client 8.10+ provisions CurveZMQ keys for it ("auto").
KERNEL_CONFIG = {"KernelManager": {"transport_encryption": "auto"}}
STAMP_FILES = ("scripts/tx_part4.py", "scripts/tx_model_configs",
               "measurements", "requirements.txt",
               "requirements-nodeps.txt", "constraints.txt",
               "pyproject.toml")
STAMP_PACKAGES = ("torch", "transformers", "numpy", "pandas",
                  "matplotlib", "ipykernel", "myst-nb")
#: what a user sets on purpose that changes outputs: a simulated machine,
#: torch's CPU kernels (Part 4 saw a value move by a fifth)
STAMP_VARIABLES = ("WHY_SELF_ATTENTION_MACHINE", "ATEN_CPU_CAPABILITY")
#: every kernel's environment over the caller's, so that outputs do not
#: depend on whether make set these: offline, fixed hashing, figures
KERNEL_ENV = {"MPLBACKEND": INLINE_BACKEND, "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0",
              "TOKENIZERS_PARALLELISM": "false",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
#: tx_part4 glues a value's kind, tolerance, a claim's ratio and threshold
#: and a phrase's words under this prefix + the key (a colon: never a key)
HINT = module_constant("HINT")


def kernel_config():
    """The traitlets config of every kernel the build, the tests and
    compat start."""
    from traitlets.config import Config

    return Config(KERNEL_CONFIG)


def stamp_inputs(root: Path = ROOT) -> dict[str, str | None]:
    """Everything a page's outputs depend on besides its code cells: each
    file's hash, each package's version, each variable's value."""
    from importlib.metadata import version

    inputs = {"python": sys.version}
    for name in STAMP_FILES:
        path = root / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.is_dir() or "__pycache__" in file.parts:
                continue
            inputs[file.relative_to(root).as_posix()] = (
                hashlib.sha256(file.read_bytes()).hexdigest()[:16]
                if file.exists() else None)
    for package in STAMP_PACKAGES:
        inputs[package] = version(package)
    for variable in STAMP_VARIABLES:
        inputs[variable] = os.environ.get(variable)
    return inputs


def changed_inputs(old: dict, new: dict, shown: int = 3) -> str:
    """The inputs whose hash, version or value differ, a few by name."""
    names = [k for k in {**new, **old} if old.get(k) != new.get(k)]
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0
                                       else "")


def open_cache(fresh: bool = False, read_only: bool = False):
    """The cache, emptied when asked or when the stamp changed, with every
    notebook in its project. `read_only` (the render, the number check):
    a changed stamp fails instead, the cache left as it is."""
    from jupyter_cache import get_cache

    inputs = stamp_inputs()
    try:                        # an older build's stamp: a plain digest
        old = json.loads(STAMP.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        old = None
    changed = (changed_inputs(old, inputs) if isinstance(old, dict)
               else f"{rel(STAMP)} (none, or an older build's)")
    if read_only and old != inputs:
        fail(f"{changed} changed since the notebooks ran: run `make book`")
    if fresh or old != inputs:
        shutil.rmtree(CACHE, ignore_errors=True)
        if old is not None and not fresh:
            print(f"execute: {changed} changed: every page runs again")
        BUILD.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(json.dumps(inputs, indent=1), encoding="utf-8")
    cache = get_cache(str(CACHE))
    for path in notebook_sources():
        cache.add_nb_to_project(str(path), read_data=READER)
    return cache


def stale(cache, paths: list[Path]) -> list[Path]:
    """The notebooks without an executed copy of their code cells: what
    myst-nb would execute itself."""
    return [p for p in paths if cache.get_cached_project_nb(str(p)) is None]


def run_alone(path: str, env: dict[str, str] | None = None):
    """Execute one notebook (.md or .ipynb) as a learner runs it: in an
    empty folder, offline, with this project's kernel and `env` in the
    kernel's environment (this process's is left as it is). Returns
    (path, seconds, error or None, notebook)."""
    import traceback

    import nbformat
    from jupyter_cache.readers import get_reader
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    notebook = (get_reader(READER)(path) if path.endswith(".md")
                else nbformat.read(path, as_version=4))
    kernel_env = {**os.environ, **KERNEL_ENV, **(env or {})}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        client = NotebookClient(notebook, timeout=TIMEOUT,
                                allow_errors=False, record_timing=False,
                                resources={"metadata": {"path": cwd}},
                                config=kernel_config())
        try:
            # the kernel shuts down gracefully: its Python's teardown runs
            client.execute(env=kernel_env)
        except (CellExecutionError, CellTimeoutError):
            return (path, time.perf_counter() - start,
                    traceback.format_exc(), None)
    return path, time.perf_counter() - start, None, notebook


def execute(only: list[str] | None = None,
            fresh: bool = False) -> dict[str, float]:
    """Execute the stale notebooks (all when `fresh`), WORKERS at a time,
    largest first, into the cache. Returns each one's seconds."""
    from jupyter_cache.base import CacheBundleIn

    cache = open_cache(fresh and not only)
    paths = [p for p in notebook_sources() if not only or p.stem in only]
    # fresh with pages named: those run again, the rest stay cached
    todo = sorted(paths if fresh else stale(cache, paths),
                  key=lambda p: -p.stat().st_size)
    times, errors, start = {}, [], time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(WORKERS) as pool:
        runs = [pool.submit(run_alone, str(path)) for path in todo]
        for run in concurrent.futures.as_completed(runs):
            path, seconds, error, notebook = run.result()
            stem = Path(path).stem
            times[stem] = round(seconds, 2)
            print(f"  {stem:35s} {seconds:6.1f} s"
                  + ("  FAILED" if error else ""))
            if error is not None:       # nbclient quotes the cell
                marker = "An error occurred while executing"
                errors.append(f"notebooks/{stem}.md: "
                              + error[max(error.find(marker), 0):])
                continue
            cache.cache_notebook_bundle(
                CacheBundleIn(notebook, path,
                              data={"execution_seconds": seconds}),
                check_validity=False, overwrite=True)
    print(f"executed {len(todo)} of {len(paths)} notebooks in "
          f"{time.perf_counter() - start:.1f} s ({WORKERS} at a time, each "
          f"in an empty folder); {len(paths) - len(todo)} from the cache")
    if errors:
        fail("a notebook failed to execute:\n" + "\n".join(errors))
    return times


def require_executed(cache=None) -> None:
    """Fail, before Sphinx starts, if myst-nb would execute a notebook."""
    cache = cache or open_cache(read_only=True)
    missing = [p.name for p in stale(cache, notebook_sources())]
    if missing:
        fail(f"no executed copy of {', '.join(missing)} in the cache: "
             f"Sphinx would execute it. Run `make book`.")


# ── glued values ──────────────────────────────────────────────────────


@dataclass
class Glued:
    """One glued value as the executed notebook holds it."""
    value: object
    kind: str | None = None       # the kind tx.show was given
    tol: float | None = None
    ratio: float | None = None        # a claim (tx.claim): its ratio
    threshold: float | None = None    # ... and the threshold to exceed
    values: list | None = None        # a phrase: the words it may take

    @property
    def margin(self) -> float | None:
        """A claim's ratio ÷ threshold (under 2: another machine may flip
        it)."""
        if self.ratio is None or not self.threshold:
            return None
        return self.ratio / self.threshold


def glued_in_notebook(notebook) -> dict[str, Glued]:
    """Every key myst_nb.glue stored in an executed notebook, its value
    read back from its text, with the hints tx_part4 glued beside it."""
    found, hints = {}, {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            glue = output.get("metadata", {}).get("scrapbook")
            if not glue:
                continue
            text = output.get("data", {}).get(
                glue.get("mime_prefix", "") + "text/plain")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError):
                value = text            # a figure or table glued whole
            name = glue["name"]
            if name.startswith(HINT):
                hints[name[len(HINT):]] = value
            else:
                found[name] = value
    # no hint: the kind tx.show gives a value of its type
    return {key: Glued(value, **{"kind": "close" if isinstance(value, float)
                                 else "exact", **hints.get(key, {})})
            for key, value in found.items()}


def glued_values(only: list[str] | None = None
                 ) -> dict[str, dict[str, Glued]]:
    """The glued values of every executed notebook (or those named)."""
    if not CACHE.exists():
        fail("no executed notebooks: run `make book` first")
    cache = open_cache(read_only=True)
    pages = {}
    for path in notebook_sources():
        if only and path.stem not in only:
            continue
        record = cache.get_cached_project_nb(str(path))
        if record is None:
            fail(f"notebooks/{path.name} has no up-to-date executed copy "
                 f"in the cache: run `make book`")
        notebook = cache.get_cache_bundle(record.pk).nb
        pages[path.stem] = glued_in_notebook(notebook)
    return pages
