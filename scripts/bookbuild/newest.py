"""`make newest` (the weekly workflow): a new .venv with the newest
releases within pyproject.toml's ranges, not the lock: torch's newest CPU
build, then the helpers with the `book` and `test` extras (editable),
every dependency as pip resolves it. The packages with a newer release
than the one installed are named in the job summary. The stamp `make env`
keeps (.venv/.pins) is written last, so `make book` and `make test` use
this environment until requirements.txt changes. Only the standard
library here: `make newest` runs on the system's python3."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def commands(python: str) -> list[list[str]]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    torch = next(line.replace(" ", "") for line in tomllib.loads(text)[
        "project"]["dependencies"] if re.match(r"torch\s*[<>=!~]", line))
    pip = [python, "-m", "pip", "install", "--quiet"]
    return [pip + ["--upgrade", "pip"],
            pip + [torch, "--index-url", TORCH_INDEX],
            pip + ["-e", f"{ROOT}[book,test]"]]


def main(argv: list[str]) -> int:
    python = str(VENV / "bin" / "python")
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for command in commands(python):
        print("$", " ".join(command[2:]), flush=True)
        if subprocess.run(command).returncode != 0:
            print("make newest FAILED", file=sys.stderr)
            return 1
    frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    listed = subprocess.run([python, "-m", "pip", "list", "--outdated",
                             "--format=json"], capture_output=True,
                            text=True).stdout
    held = [f"{p['name']} {p['version']} (newest: {p['latest_version']})"
            for p in json.loads(listed or "[]")]
    text = ("### The newest releases within the declared ranges\n\n"
            + (f"Newer releases, not installed: {', '.join(held)}.\n\n"
               if held else "") + f"```\n{frozen}```\n")
    print(text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as out:
            out.write(text)
    (VENV / ".pins").write_text("# make newest, not the pins\n" + frozen,
                                encoding="utf-8")
    return 0
