"""`make newest`: .venv with the newest releases pip allows within the
ranges pyproject.toml declares, not the lock (the weekly workflow).

    python3 scripts/book.py newest --venv .venv --stamp .venv/.pins

A new virtual environment gets torch's newest CPU build within its range,
then the book's helpers with their `book` and `test` extras (editable), each
package the newest its range allows, with every dependency (the model
package's sentence-transformers, scikit-learn and SciPy too, as on Colab).
The packages pip reports as outdated (a newer release outside a declared
range, or held back by another package) are named in the job summary
(GITHUB_STEP_SUMMARY), not installed.
The stamp `make env` keeps is written last (pip freeze: newer than the lock
and unlike it), so `make book` uses this environment until requirements.txt
changes. The weekly workflow then runs
`WHY_SELF_ATTENTION_RELEASES=newest make book`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_range() -> str:
    """torch's range in pyproject.toml's dependencies, e.g. `>=2.13,<3`."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for line in tomllib.loads(text)["project"]["dependencies"]:
        found = re.fullmatch(r"torch\s*([<>=!~][^;]*)", line.strip())
        if found:
            return found[1].replace(" ", "")
    raise KeyError("pyproject.toml declares no range for torch")


def commands(python: str) -> list[list[str]]:
    """The pip commands that fill the environment, in order."""
    pip = [python, "-m", "pip", "install", "--quiet"]
    return [pip + ["--upgrade", "pip"],
            pip + ["torch" + torch_range(), "--index-url", TORCH_INDEX],
            pip + ["-e", f"{ROOT}[book,test]"]]


def outdated(python: str) -> list[str]:
    """`name version (newest: version)` for each package with a newer
    release than the one installed."""
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--outdated", "--format=json"],
        capture_output=True, text=True).stdout
    return [f"{p['name']} {p['version']} (newest: {p['latest_version']})"
            for p in json.loads(listed or "[]")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--stamp", help="default: VENV/.pins")
    args = parser.parse_args(argv)
    venv = Path(args.venv)
    python = str(venv / "bin" / "python")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for command in commands(python):
        print("$", " ".join(command[2:]), flush=True)
        if subprocess.run(command).returncode != 0:
            print("make newest FAILED", file=sys.stderr)
            return 1
    frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    held = outdated(python)
    text = ("### The newest releases within the declared ranges\n\n"
            + (f"Newer releases, not installed: {', '.join(held)}.\n\n"
               if held else "")
            + "```\n" + frozen + "```\n")
    print(text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as out:
            out.write(text)
    stamp = Path(args.stamp) if args.stamp else venv / ".pins"
    stamp.write_text("# make newest, not the pins\n" + frozen,
                     encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
