"""The GitHub Actions workflows (.github/workflows/), checked offline, and what the build does
when it runs in one.

* Every workflow file is valid against GitHub's workflow schema, read from the pinned validator
  (check-jsonschema carries it: no network), and every `run:` step calls a make target that
  `make -n` accepts. A broken copy shows each failure naming the file and the line.
* The publishing rules: actions pinned to a release, least privilege, one deploy at a time,
  caches keyed by what changes them, the weekly build on the newest releases.
* In a workflow, the site's buttons name the workflow's repository (GITHUB_REPOSITORY), and a
  failing number check writes its table to the job summary (GITHUB_STEP_SUMMARY).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bookbuild import common, execute, newest, numbers, pairs, site

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
SCHEMA = "vendor.github-workflows"                 # check-jsonschema's copy of GitHub's schema
#: A release tag (v1.2.3) or a full commit: a moving major tag (v4) or a branch is not a pin.
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@(v\d+\.\d+\.\d+|[0-9a-f]{40})$")


def workflow_files(folder: Path = WORKFLOWS) -> list[Path]:
    """Every workflow file of a folder."""
    return sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")])


def load(path: Path) -> dict:
    """A workflow as data; its `on:` key is read as the string (YAML 1.1 would make it True)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:
        data["on"] = data.pop(True)
    return data


# ── where in the file: a JSON path of the validator as a line of the file ──────────────────


def node_at(root, path: str):
    """The YAML node that a JSON path such as `$.jobs.book.steps[2]` names, and the node of the
    key that holds it (for a line that shows the key); as far as the path can be followed."""
    node, key_node = root, None
    for dotted, index, quoted in re.findall(r"\.([^.\[]+)|\[(\d+)\]|\['([^']*)'\]",
                                            path.removeprefix("$")):
        name = dotted or quoted
        if name and isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == name), None)
            if found is None:
                break
            key_node, node = found
        elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            key_node, node = None, node.value[int(index)]
        else:
            break
    return node, key_node


def line_of(text: str, path: str, message: str = "") -> int:
    """The line (1-based) an error at a JSON path points at. An unexpected key named in the
    message (`'timeout_minutes' was unexpected`) points at that key's own line."""
    node, key_node = node_at(yaml.compose(text), path)
    unexpected = re.findall(r"'([^']+)'", message.partition("(")[2]) if "unexpected" in message else []
    if unexpected and isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if key.value in unexpected:
                return key.start_mark.line + 1
    return (key_node or node).start_mark.line + 1


# ── the schema ────────────────────────────────────────────────────────────────────────────


def schema_problems(files: list[Path]) -> list[str]:
    """`FILE:LINE: $.json.path: message` for every schema error, from the pinned validator."""
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA,
                           "--output-format", "json", *map(str, files)],
                          capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return [f"check-jsonschema failed to run (exit {done.returncode}): {done.stderr[-800:]}"]
    problems = []
    for error in report.get("errors", []):
        best = error.get("best_deep_match") or error.get("best_match") or error
        path = Path(error["filename"])
        line = line_of(path.read_text(encoding="utf-8"), best["path"], best["message"])
        problems.append(f"{path.name}:{line}: {best['path']}: {best['message']}")
    for error in report.get("parse_errors", []):
        problems.append(f"{Path(error.get('filename', '?')).name}: not YAML: {error.get('message')}")
    if done.returncode != 0 and not problems:
        problems.append(f"check-jsonschema exited {done.returncode}: {done.stdout[-800:]}")
    return problems


# ── the run: steps and their make targets ─────────────────────────────────────────────────


def run_steps(path: Path) -> list[tuple[int, str, str]]:
    """(line, job, script) of every `run:` step of a workflow."""
    root = yaml.compose(path.read_text(encoding="utf-8"))
    steps = []
    jobs, _ = node_at(root, "$.jobs")
    for job_key, job in jobs.value if isinstance(jobs, yaml.MappingNode) else []:
        found, _ = node_at(job, "$.steps")
        for step in found.value if isinstance(found, yaml.SequenceNode) else []:
            for key, value in step.value:
                if key.value == "run":
                    steps.append((key.start_mark.line + 1, job_key.value, value.value))
    return steps


def make_calls(script: str) -> list[list[str]] | None:
    """The targets of each `make` command of a shell script (a command without a target: the
    default, as []); None if a command of the script is not make."""
    calls = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for command in re.split(r"&&|\|\||;", line):
            words = shlex.split(command)
            while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                words.pop(0)                            # VAR=value make ...
            if not words or words[0] != "make":
                return None
            calls.append([w for w in words[1:] if not w.startswith("-") and "=" not in w])
    return calls


def make_accepts(target: str) -> str | None:
    """None if `make -n TARGET` (a dry run: nothing is executed) accepts the target, else make's
    complaint."""
    # as a top-level make, also when `make test` runs this (no "make[1]:" in the message)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "-n", *([target] if target else [])], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def step_problems(files: list[Path]) -> list[str]:
    """`FILE:LINE: ...` for every `run:` step that is not make, or names a target make lacks."""
    problems = []
    for path in files:
        for line, job, script in run_steps(path):
            calls = make_calls(script)
            if not calls:
                problems.append(f"{path.name}:{line}: job {job}: the step runs {script.strip()!r}, "
                                f"not a make target (one source: .ci/run calls the same targets)")
                continue
            for targets in calls:
                for target in targets or [""]:
                    complaint = make_accepts(target)
                    if complaint:
                        problems.append(f"{path.name}:{line}: job {job}: `make {target}`: "
                                        f"make -n {target} fails: {complaint}")
    return problems


def ci_run_targets() -> set[str]:
    """The make targets that .ci/run calls."""
    targets = set()
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        words = shlex.split(line.split("#", 1)[0])
        if words[:1] == ["make"]:
            targets |= {w for w in words[1:] if not w.startswith("-") and "=" not in w}
    return targets


# ── the workflows as they are ─────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def workflows() -> dict[str, dict]:
    files = workflow_files()
    assert files, f"no workflow in {WORKFLOWS.relative_to(ROOT)}"
    return {path.name: load(path) for path in files}


def test_every_workflow_matches_githubs_schema():
    problems = schema_problems(workflow_files())
    assert not problems, "\n".join(problems)


def test_every_run_step_calls_a_make_target_that_exists():
    problems = step_problems(workflow_files())
    assert not problems, "\n".join(problems)


def test_the_workflow_and_ci_run_call_the_same_targets(workflows):
    called = {target for path in workflow_files() if path.name == "book.yml"
              for _, _, script in run_steps(path) for call in make_calls(script) or [] for target in call}
    assert called == ci_run_targets(), "book.yml and .ci/run must run the same make targets"


def test_every_action_is_pinned_to_a_release(workflows):
    used = [(name, step["uses"]) for name, flow in workflows.items() for job in flow["jobs"].values()
            for step in job.get("steps", []) if "uses" in step]
    assert used
    loose = [f"{name}: {uses}" for name, uses in used if not PINNED.match(uses)]
    assert not loose, "actions not pinned to a release (vX.Y.Z or a commit):\n" + "\n".join(loose)


def test_only_the_deploy_job_can_write(workflows):
    for name, flow in workflows.items():
        assert flow.get("permissions") == {"contents": "read"}, name
        for job_name, job in flow["jobs"].items():
            if job_name != "deploy":
                assert "permissions" not in job, f"{name}: job {job_name} sets its own permissions"
    deploy = workflows["book.yml"]["jobs"]["deploy"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["concurrency"] == {"group": "pages", "cancel-in-progress": False}
    assert deploy["environment"]["name"] == "github-pages"
    assert "pull_request" in deploy["if"] and "refs/heads/main" in deploy["if"]


def test_the_site_and_its_pdf_go_to_pages_through_githubs_actions(workflows):
    jobs = workflows["book.yml"]["jobs"]
    uses = lambda job: [s["uses"].split("@")[0] for s in jobs[job]["steps"] if "uses" in s]  # noqa: E731
    runs = [s.get("run") for s in jobs["site"]["steps"]]
    upload = next(s for s in jobs["site"]["steps"] if s.get("uses", "").startswith(
        "actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html" and upload["if"] == jobs["deploy"]["if"]
    # the PDF is in the site when the artifact is made: `make pdf` copies it there
    assert runs.index("make pdf") < runs.index("make site-test") < jobs["site"]["steps"].index(upload)
    assert uses("deploy") == ["actions/configure-pages", "actions/deploy-pages"]
    assert set(jobs["deploy"]["needs"]) >= {"site", "test"} and jobs["site"]["needs"] == "book"
    on = workflows["book.yml"]["on"]
    assert on["push"]["branches"] == ["main"] and "pull_request" in on


def test_the_caches_are_keyed_by_what_changes_them(workflows):
    jobs = workflows["book.yml"]["jobs"]
    caches = {(job, s["name"]): s["with"] for job, spec in jobs.items() for s in spec["steps"]
              if s.get("uses", "").startswith("actions/cache")}
    pip = [w for (_, name), w in caches.items() if w["path"] == "~/.cache/pip"]
    assert pip and all("requirements.txt" in w["key"] and "requirements-nodeps.txt" in w["key"]
                       for w in pip)
    execution = [w for w in caches.values() if "_build/.jupyter_cache" in w["path"]]
    assert len(execution) == 2                      # saved by the book job, read by the site job
    assert execution[0]["key"] == execution[1]["key"]
    # what the stamp beside the cache hashes, and the notebooks (jupyter-cache's own key)
    for name in ("notebooks/*.md", *execute.STAMP_FILES):
        part = name + "/**" if (common.ROOT / name).is_dir() else name
        assert f"'{part}'" in execution[0]["key"], part
    assert "_build/jupyter_cache.inputs" in execution[0]["path"]
    assert execution[0]["key"].startswith(execution[0]["restore-keys"])
    assert jobs["book"]["env"]["FRESH"].count("'0'") == 1     # pull requests: from the cache


def test_the_weekly_build_runs_the_newest_releases_not_the_pins(workflows):
    weekly = workflows["weekly.yml"]
    assert weekly["on"]["schedule"] and "workflow_dispatch" in weekly["on"]
    runs = [s.get("run") for job in weekly["jobs"].values() for s in job["steps"] if "run" in s]
    assert runs[:2] == ["make newest", "make book"], runs
    assert all(w["path"] != "_build/.jupyter_cache" for job in weekly["jobs"].values()
               for s in job["steps"] for w in [s.get("with", {})] if "path" in w)


# ── the checks fail on a broken copy, naming the file and the line ────────────────────────


def broken_copy(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """book.yml with one change, and the line of the change."""
    text = (WORKFLOWS / "book.yml").read_text(encoding="utf-8")
    assert old in text
    copy = tmp_path / "book.yml"
    copy.write_text(text.replace(old, new, 1), encoding="utf-8")
    return copy, text[:text.index(old)].count("\n") + 1


def test_a_typo_in_a_key_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "timeout-minutes: 15", "timeout_minutes: 15")
    assert schema_problems([copy]) == [
        f"book.yml:{line}: $.jobs.deploy: Additional properties are not allowed "
        f"('timeout_minutes' was unexpected)"]


def test_a_wrong_value_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "cancel-in-progress: false", "cancel-in-progress: never")
    problems = schema_problems([copy])
    assert len(problems) == 1 and problems[0].startswith(f"book.yml:{line}: $.jobs.deploy.concurrency")


def test_a_step_that_calls_a_missing_target_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "run: make site-test", "run: make site-tests")
    problems = step_problems([copy])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"book.yml:{line}: job site: `make site-tests`: make -n site-tests "
                                  f"fails: make: *** No rule to make target 'site-tests'")


def test_a_step_that_is_not_make_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "run: make pdf", "run: .venv/bin/python scripts/pdf.py")
    assert step_problems([copy]) == [
        f"book.yml:{line}: job site: the step runs '.venv/bin/python scripts/pdf.py', not a make "
        f"target (one source: .ci/run calls the same targets)"]


def test_make_calls_reads_targets_and_refuses_other_commands():
    assert make_calls("make test") == [["test"]]
    assert make_calls("FRESH=1 make book FRESH=1 -j2 && make pdf  # then the PDF") == [["book"], ["pdf"]]
    assert make_calls("make") == [[]]
    assert make_calls("make book\npython -m pytest") is None


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_dry_run_refuses_an_unknown_target():
    assert make_accepts("book") is None
    assert "No rule to make target 'no-such-target'" in make_accepts("no-such-target")


# ── in a workflow: the fork's own repository on the buttons ───────────────────────────────


def cli() -> dict:
    """The command line's part of Jupyter Book's configuration for an html build."""
    return {"latex_individualpages": False}


def test_the_site_names_the_workflows_repository_and_by_default_the_configured_one(tmp_path, monkeypatch):
    from jupyter_book.config import get_final_config

    monkeypatch.setattr(site, "SITE_CONFIG", tmp_path / "_config.site.yml")
    assert site.site_repository_url({}) == common.repository_url()
    assert site.site_config_option({}) == []                        # local: _config.yml as it is
    assert site.site_config_option({"GITHUB_REPOSITORY": "why-self-attention/why-self-attention"}) == []
    option = site.site_config_option({"GITHUB_REPOSITORY": "someone/fork"})
    assert option == ["--config", str(tmp_path / "_config.site.yml")]
    sphinx, _ = get_final_config(user_yaml=Path(option[1]), sourcedir=ROOT, cli_config=cli())
    theme = sphinx["html_theme_options"]
    assert theme["repository_url"] == "https://github.com/someone/fork"
    assert theme["repository_branch"] == "main" and theme["use_repository_button"]
    assert theme["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    default, _ = get_final_config(user_yaml=ROOT / "_config.yml", sourcedir=ROOT, cli_config=cli())
    # everything else as _config.yml has it; the local extensions found from any folder
    same = {k for k in default if k != "html_theme_options" and sphinx.get(k) != default[k]}
    assert not same, same
    for folder in load(Path(option[1]))["sphinx"]["local_extensions"].values():
        assert Path(folder).is_absolute() and Path(folder).is_dir()
    # the Colab cell of the committed notebooks keeps naming _config.yml's repository
    assert "someone/fork" not in pairs.colab_cell()


def test_the_html_step_passes_the_forks_config_to_jupyter_book(tmp_path, monkeypatch):
    """site.html() renders with the fork's repository when GITHUB_REPOSITORY is set."""
    calls = []
    monkeypatch.setattr(site, "SITE_CONFIG", tmp_path / "_config.site.yml")
    monkeypatch.setattr(site, "BUILD", tmp_path)
    monkeypatch.setattr(site, "require_executed", lambda: None)
    monkeypatch.setenv("GITHUB_REPOSITORY", "someone/fork")
    monkeypatch.setattr(site.subprocess, "run", lambda command, **kw: calls.append(command) or
                        subprocess.CompletedProcess(command, 0, "", ""))
    site.html()
    assert calls and "--config" in calls[0]          # wherever it stands (CI adds --all)
    at = calls[0].index("--config")
    assert calls[0][at + 1] == str(tmp_path / "_config.site.yml")
    assert "https://github.com/someone/fork" in (tmp_path / "_config.site.yml").read_text()


TINY_NOTEBOOK = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
# A part

```{code-cell} ipython3
1 + 1
```
"""


@pytest.mark.slow
def test_a_fork_renders_launch_buttons_that_open_the_fork(tmp_path, monkeypatch):
    """A real render (Jupyter Book, this book's configuration through --config, one small part):
    with GITHUB_REPOSITORY=someone/fork, the Colab, Binder and repository buttons name the fork."""
    write = lambda path, text: path.parent.mkdir(parents=True, exist_ok=True) or path.write_text(text)  # noqa: E731
    write(tmp_path / "_toc.yml", "format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/01_part\n")
    write(tmp_path / "book" / "intro.md", "# Intro\n")
    write(tmp_path / "book" / "references.bib", (ROOT / "book" / "references.bib").read_text())
    write(tmp_path / "notebooks" / "01_part.md", TINY_NOTEBOOK)
    write(tmp_path / "notebooks" / "01_part.ipynb", "")   # its pair: the buttons open the .ipynb
    monkeypatch.setattr(site, "SITE_CONFIG", tmp_path / "_build" / "_config.site.yml")
    option = site.site_config_option({"GITHUB_REPOSITORY": "someone/fork"})
    done = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(tmp_path),
                           "--builder", "html", *option], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    page = (tmp_path / "_build" / "html" / "notebooks" / "01_part.html").read_text(encoding="utf-8")
    links = set(re.findall(r'href="(https://(?:colab|mybinder|github)[^"]+)"', page))
    assert links == {"https://colab.research.google.com/github/someone/fork/blob/main/notebooks/01_part.ipynb",
                     "https://mybinder.org/v2/gh/someone/fork/main?urlpath=lab/tree/notebooks/01_part.ipynb",
                     "https://github.com/someone/fork"}, links


# ── in a workflow: a failing number check writes its table to the job summary ─────────────


#: A claim (tx.claim) added to the page's expectations: it holds while ratio > threshold.
CLAIM = ("band_beats_mask_4096", {"kind": "exact", "value": True, "threshold": 2.0})


def expectations(page: str = "01_costs") -> dict[str, dict[str, dict]]:
    """numbers.toml's expectations for one page, with a claim added."""
    expected = {page: dict(numbers.load_expected()[page])}
    expected[page][CLAIM[0]] = CLAIM[1]
    return expected


def drifted_build(expected: dict[str, dict[str, dict]]) -> tuple[dict, str]:
    """The glued values of a build that matches `expected` (one page), but for a count that
    drifted by one and a claim whose ratio fell under its threshold: (glued, the count's key)."""
    (page, entries), = expected.items()
    glued = {key: execute.Glued(entry["value"], entry["kind"], entry.get("tol"),
                             2.0 * entry["threshold"] if "threshold" in entry else None,
                             entry.get("threshold"), entry.get("values"))
             for key, entry in entries.items()}
    count = next(k for k, e in entries.items() if e["kind"] == "exact" and type(e["value"]) is int)
    glued[count].value += 1
    glued[CLAIM[0]].value, glued[CLAIM[0]].ratio = False, 1.0     # 1.0 / 2.0: it no longer holds
    return {page: glued}, count


def test_a_drifted_number_writes_the_table_to_the_job_summary(tmp_path, monkeypatch):
    expected = expectations()
    glued, count = drifted_build(expected)
    monkeypatch.setattr(numbers, "load_expected", lambda: expected)
    summary = tmp_path / "summary.md"
    summary.write_text("### an earlier step's summary\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    with pytest.raises(common.BuildError) as failure:
        numbers.check_numbers(["01_costs"], glued=glued)
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("### an earlier step's summary\n")             # appended, not replaced
    assert "### Number check: 2 problem(s) in" in text
    header = next(line for line in text.splitlines() if line.startswith("| page |"))
    assert header == "| page | key | kind | expected | got | ratio / threshold | what |"
    rows = [line for line in text.splitlines() if line.startswith("| 01_costs |")]
    value = numbers.fmt(glued["01_costs"][count].value)
    assert sorted(rows) == sorted([
        f"| 01_costs | `{count}` | exact | {numbers.fmt(expected['01_costs'][count]['value'])} | "
        f"{value} | — | drifted |",
        f"| 01_costs | `{CLAIM[0]}` | exact | True | False | 1 / 2 = 0.50 | drifted |"])
    # the terminal shows its own table, as before
    assert numbers.problem_table(numbers.compare(expected, glued)) in str(failure.value)


def test_without_a_workflow_the_check_fails_as_before_and_writes_no_summary(tmp_path, monkeypatch):
    expected = expectations()
    glued, count = drifted_build(expected)
    monkeypatch.setattr(numbers, "load_expected", lambda: expected)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(common.BuildError) as failure:
        numbers.check_numbers(["01_costs"], glued=glued)
    table = numbers.problem_table(numbers.compare(expected, glued))
    assert count in table and "1 / 2 = 0.50" in table and table in str(failure.value)
    assert list(tmp_path.iterdir()) == []


def test_a_bar_in_a_value_does_not_break_the_markdown_table():
    problem = numbers.Problem("01_costs", "k", "measured", "a | b", "c\nd", "a phrase must be one of")
    table = numbers.markdown_problem_table([problem]).splitlines()
    assert table[2] == "| 01_costs | `k` | measured | a \\| b | c d | — | a phrase must be one of |"


def test_on_the_newest_releases_a_release_name_is_not_a_drift(monkeypatch):
    """The weekly build names a newer transformers on its pages: with
    WHY_SELF_ATTENTION_RELEASES=newest that key must be a version, not the pin; all else as always."""
    page = next(p for p, keys in numbers.load_expected().items() if "transformers_version" in keys)
    expected = {page: numbers.load_expected()[page]}
    glued = {page: {key: execute.Glued(e["value"], e["kind"], e.get("tol"), None, e.get("threshold"),
                                    e.get("values")) for key, e in expected[page].items()}}
    glued[page]["transformers_version"].value = "5.99.0"
    monkeypatch.setattr(numbers, "load_expected", lambda: expected)
    monkeypatch.delenv(numbers.RELEASES, raising=False)
    with pytest.raises(common.BuildError, match="transformers_version"):
        numbers.check_numbers([page], glued=glued)
    monkeypatch.setenv(numbers.RELEASES, "newest")
    numbers.check_numbers([page], glued=glued)                          # passes: not compared
    glued[page]["transformers_version"].value = "not a release"
    with pytest.raises(common.BuildError, match="not a version string"):
        numbers.check_numbers([page], glued=glued)


def test_the_weekly_build_asks_for_versions_not_the_pins(workflows):
    assert workflows["weekly.yml"]["jobs"]["newest"]["env"][numbers.RELEASES] == "newest"
    assert all(numbers.RELEASES not in job.get("env", {}) for job in workflows["book.yml"]["jobs"].values())


# ── the weekly build's environment ────────────────────────────────────────────────────────


def test_the_newest_environment_takes_every_pinned_package_within_its_declared_range():
    pinned = {**newest.pins(newest.REQUIREMENTS), **newest.pins(newest.NODEPS)}
    ranges = newest.declared_ranges()
    commands = newest.commands("python")
    torch = commands[1]
    assert torch[-3:] == ["torch>=2.13,<3", "--index-url", "https://download.pytorch.org/whl/cpu"]
    named = [re.match(r"[A-Za-z0-9._\[\]-]+", word).group() for command in commands[1:4]
             for word in command[5:] if not word.startswith(("-", "http"))]
    assert sorted(newest.canonical(name) for name in named) == sorted(pinned)
    assert not any("==" in word for command in commands for word in command)
    assert "jupyter-book>=1,<2" in commands[2] and ranges["jupyter-book"] == ">=1,<2"
    assert commands[3][5] == "--no-deps"             # requirements-nodeps.txt, as make env does
    assert "check-jsonschema" in pinned              # this test's own validator is pinned


def test_every_declared_range_admits_its_pin():
    """The pins are releases the ranges allow: `make newest` can only move forward from them."""
    pinned = {**newest.pins(newest.REQUIREMENTS), **newest.pins(newest.NODEPS)}
    for name, spec in newest.declared_ranges().items():
        limit = newest.upper_major(spec)
        if name in pinned and limit is not None:
            assert int(pinned[name].split(".")[0]) < limit, (name, spec)


def test_a_newer_major_release_is_named_not_installed(tmp_path):
    """A new major version outside a declared range goes to the summary, and fails nothing."""
    ranges = {"jupyter-book": ">=1,<2", "transformers": ">=5.15,<6", "numpy": "<3"}
    releases = {"jupyter-book": "2.1.7", "transformers": "5.25.0", "numpy": None}
    outside = newest.outside_ranges(ranges, releases.get)
    assert outside == ["jupyter-book 2.1.7 (declared >=1,<2)"]
    summary = tmp_path / "summary.md"
    text = newest.report({"torch": "2.13.0"}, {"torch": "2.13.0"}, str(summary), outside)
    assert "outside the ranges pyproject.toml declares" in text and "jupyter-book 2.1.7" in text
    assert newest.upper_major(">=1,<2") == 2 and newest.upper_major(">=2.13") is None


def test_the_newest_report_names_what_changed(tmp_path):
    summary = tmp_path / "summary.md"
    text = newest.report({"torch": "2.13.0", "numpy": "2.4.6"},
                         {"torch": "2.15.0+cpu", "numpy": "2.4.6"}, str(summary))
    assert "1 of 2 pinned packages ran another release: torch 2.13.0 → 2.15.0+cpu" in text
    assert "| torch | 2.13.0 | **2.15.0+cpu** |" in text and "| numpy | 2.4.6 | 2.4.6 |" in text
    assert summary.read_text(encoding="utf-8") == text
    assert newest.same_release("2.13.0", "2.13.0+cpu")


def test_make_newest_hands_the_environment_and_its_stamp_to_the_script():
    done = subprocess.run(["make", "-n", "newest"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "scripts/book.py newest --venv .venv --stamp .venv/.pins" in done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_keeps_the_newest_environment_until_the_pins_change(tmp_path):
    """After `make newest`, `make book` and `make test` use that environment as it is (its stamp
    is newer than the pins); once requirements.txt changes, `make env` rebuilds from the pins."""
    import os

    for name in ("Makefile", "requirements.txt", "requirements-nodeps.txt", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    newest.write_stamp(tmp_path / ".venv" / ".pins", {"torch": "2.15.0+cpu", "numpy": "2.9.0"})
    dry_run = lambda: subprocess.run(["make", "-n", "env"], cwd=tmp_path, capture_output=True,  # noqa: E731
                                     text=True, check=True).stdout
    assert "pip install" not in dry_run()                          # kept as it is
    later = (tmp_path / ".venv" / ".pins").stat().st_mtime + 10
    os.utime(tmp_path / "requirements.txt", (later, later))        # the pins change
    assert "recreating" in dry_run() and "pip install --quiet -r requirements.txt" in dry_run()
