"""Stage 2: the stale notebooks run through jupyter-cache's temp-parallel
executor (a process a core, each in an empty folder) into the cache myst-nb
renders from, keyed by code cells; all else outputs depend on is one stamp
(STAMP_*): when it changes, the message names what and every page reruns."""

import ast
import copy
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from bookbuild import common
from bookbuild.common import BUILD, CACHE, ROOT, TIMEOUT, fail, rel

STAMP = BUILD / "jupyter_cache.inputs"
#: myst-nb's reader of a .md: the cache keys what myst-nb looks up
READER = {"name": "myst_nb_md", "type": "plugin"}
STAMP_FILES = ("scripts/tx_part4.py", "scripts/tx_model_configs",
               "measurements", "requirements.txt", "pyproject.toml")
#: set on purpose, they change outputs: a simulated machine, torch's CPU
#: kernels (Part 4 saw a value move by a fifth)
STAMP_VARIABLES = ("WHY_SELF_ATTENTION_MACHINE", "ATEN_CPU_CAPABILITY")
#: the kernels' environment over the caller's: offline, fixed hashing,
#: Jupyter's figures even where MPLBACKEND=Agg, and IPython's config
KERNEL_ENV = {"MPLBACKEND": "module://matplotlib_inline.backend_inline",
              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1",
              "IPYTHONDIR": str(BUILD / "ipython")}
#: the kernel's log at ERROR (ipykernel 7 warns that TCP is unencrypted);
#: prints sent at a cell's end, not cut every 0.2 s (README says why)
KERNEL_CONFIG = {"IPKernelApp": {"log_level": "ERROR", "exec_lines": [
    "__import__('sys').stdout.flush_interval = 600"]}}
#: `run`'s child process: jupyter-cache's executor, a process a core
POOL = """import json, logging, sys
from jupyter_cache import executors, get_cache
path, uris, limit = json.loads(sys.argv[1])
(log := logging.getLogger("execute")).setLevel(logging.INFO)
executors.load_executor("temp-parallel", get_cache(path), logger=log
                        ).run_and_cache(filter_uris=uris, timeout=limit)"""
#: tx_part4 glues a value's kind, tolerance, a claim's ratio and threshold
#: and a phrase's words under HINT + the key
HINT = common.module_constant("HINT")


def stamp_inputs(root: Path = ROOT) -> dict[str, str | None]:
    """Each stamped file's hash, every installed package's version but
    pip's, the kernels' environment and config, each variable's value."""
    from importlib.metadata import distributions

    inputs = {"python": platform.python_version(), "kernel": json.dumps(
        [{**KERNEL_ENV, "IPYTHONDIR": None}, KERNEL_CONFIG])}
    for name in STAMP_FILES:
        path = root / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file() and "__pycache__" not in file.parts:
                inputs[file.relative_to(root).as_posix()] = hashlib.sha256(
                    file.read_bytes()).hexdigest()[:16]
    inputs.update({d.metadata["Name"]: d.version for d in distributions()
                   if d.metadata["Name"] != "pip"})
    inputs.update({v: os.environ.get(v) for v in STAMP_VARIABLES})
    return inputs


def changed_inputs(old: dict, new: dict) -> str:
    """The inputs that differ, three by name."""
    names = [k for k in {**new, **old} if old.get(k) != new.get(k)]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more"
                                   if len(names) > 3 else "")


def open_cache(fresh: bool = False, read_only: bool = False):
    """The cache with every notebook in its project, emptied when `fresh`
    or the stamp changed (`read_only`: a changed stamp fails instead)."""
    from jupyter_cache import get_cache

    inputs = stamp_inputs()
    try:
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
    # largest first: a new cache runs them in the order they were added
    for path in sorted(common.notebook_sources(),
                       key=lambda p: -p.stat().st_size):
        cache.add_nb_to_project(str(path), read_data=READER)
    return cache


def stale(cache, paths: list[Path]) -> list[Path]:
    """The notebooks with no executed copy of their code cells."""
    return [p for p in paths if cache.get_cached_project_nb(str(p)) is None]


def run(cache, uris: list[str] | None = None,
        env: dict[str, str] | None = None) -> None:
    """Execute the notebooks without an executed copy (of `uris`) in a
    child process with KERNEL_ENV and `env` set, whatever multiprocessing's
    start method; a failing cell fails, naming the notebook, quoting it."""
    profile = BUILD / "ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.json").write_text(
        json.dumps(KERNEL_CONFIG), encoding="utf-8")
    todo = [str(u) for u in ([r.uri for r in cache.list_project_records()]
                             if uris is None else uris)]
    if not todo:                # nothing stale: no executor to start
        return
    subprocess.run([sys.executable, "-c", POOL, json.dumps(
        [str(cache.path), todo, TIMEOUT])], check=True, env={
            **os.environ, **KERNEL_ENV, **(env or {})})
    errors = []
    for uri in stale(cache, [Path(u) for u in todo]):
        error = cache.get_project_record(str(uri)).traceback or "(above)"
        quote = error.find("An error occurred while executing")  # nbclient
        errors.append(f"{rel(uri)}: {error[max(quote, 0):]}")
    if errors:
        fail("a notebook failed to execute:\n" + "\n".join(errors))


def execute(only: list[str] | None = None, fresh: bool = False) -> None:
    """Execute the stale notebooks (`fresh`: all, or those in `only`)
    into the cache, printing each one's seconds."""
    cache = open_cache(fresh and not only)
    paths = [p for p in common.notebook_sources()
             if not only or p.stem in only]
    for path in paths if fresh and only else []:   # those pages' records
        record = cache.get_cached_project_nb(str(path))
        if record is not None:
            cache.remove_cache(record.pk)
    todo, start = stale(cache, paths), time.perf_counter()
    run(cache, [str(p) for p in todo])
    for path in todo:
        data = cache.get_cached_project_nb(str(path)).data
        print(f"  {path.stem:35s} {data['execution_seconds']:6.1f} s")
    print(f"executed {len(todo)} of {len(paths)} notebooks in "
          f"{time.perf_counter() - start:.1f} s ({os.cpu_count()} at a "
          f"time, each in an empty folder); {len(paths) - len(todo)} from "
          f"the cache")


def require_executed() -> None:
    """Fail, before Sphinx starts, if myst-nb would execute a notebook."""
    cache = open_cache(read_only=True)
    missing = [p.name for p in stale(cache, common.notebook_sources())]
    if missing:
        fail(f"no executed copy of {', '.join(missing)} in the cache "
             f"(Sphinx would execute it): run `make book`")


@dataclass
class Glued:
    """One glued value, with what tx_part4 glued beside it."""
    value: object
    kind: str | None = None
    tol: float | None = None
    ratio: float | None = None        # a claim (tx.claim): its ratio
    threshold: float | None = None    # ... and the threshold to exceed
    values: list | None = None        # a phrase: the words it may take
    stated: bool = False              # the notebook said the kind

    @property
    def margin(self) -> float | None:
        """A claim's ratio ÷ threshold (under 2: it may flip)."""
        if self.ratio is None or not self.threshold:
            return None
        return self.ratio / self.threshold


def glued_in_notebook(notebook, name: str = "a notebook"
                      ) -> dict[str, Glued]:
    """Every key glued in a notebook (read by myst-nb), its value from its
    text, its hints (none: the kind tx.show gives a value of its type).
    `name` names the notebook in a failure."""
    # myst-nb's own reader of glue, the one its renderer uses; not in its
    # documented API, so the pin (<2) and the tests that glue in a real
    # kernel (tests/build/test_mechanics.py) hold it
    from myst_nb.ext.glue import extract_glue_data

    found, hints = {}, {}
    notebook = copy.deepcopy(notebook)    # the reader takes outputs out
    # myst-nb reports a key glued twice through its logger's warning
    logger = SimpleNamespace(
        warning=lambda message, **_: fail(f"{name}: {message}"))
    for key, output in extract_glue_data(
            notebook, [0] * len(notebook.cells), logger).items():
        text = output["data"].get("text/plain")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError):
            value = text            # a figure or table glued whole
        (hints if key.startswith(HINT) else found)[
            key.removeprefix(HINT)] = value
    return {key: Glued(value, **{"kind": "close" if isinstance(value, float)
                                 else "exact", **hints.get(key, {})},
                       stated="kind" in hints.get(key, {}))
            for key, value in found.items()}


def glued_values(only: list[str] | None = None
                 ) -> dict[str, dict[str, Glued]]:
    """The glued values of every executed notebook (or those named)."""
    cache, pages = open_cache(read_only=True), {}
    for path in (p for p in common.notebook_sources()
                 if not only or p.stem in only):
        record = cache.get_cached_project_nb(str(path))
        if record is None:
            fail(f"notebooks/{path.name} has no up-to-date executed copy "
                 f"in the cache: run `make book`")
        pages[path.stem] = glued_in_notebook(
            cache.get_cache_bundle(record.pk).nb, f"notebooks/{path.name}")
    return pages
