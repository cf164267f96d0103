"""Exercises: every one has a solution that the build runs, collapsed on the page, whose glued
numbers all start with `ex_` (so the ledger and numbers.toml tell them apart); the exercises page
lists them all. The rendered-page check is in tests/site/test_site_exercises.py."""

from __future__ import annotations

import ast
import re

import pytest

import sitekit
from bookbuild import common, ledger, numbers

SOLUTION = re.compile(r"^```\{solution-start\}\s*(?P<label>\S+)\s*\n(?P<options>(?::[^\n]*\n)*)```\n"
                      r"(?P<body>.*?)^```\{solution-end\}", re.M | re.S)
CODE = re.compile(r"^```\{code-cell\}[^\n]*\n(?P<code>.*?)^```", re.M | re.S)
PAGES = [md for md in common.notebook_sources() if sitekit.exercises(md)]


def solutions(text: str) -> dict[str, tuple[str, str]]:
    """label: (options, body) of every gated solution of a page."""
    return {m["label"]: (m["options"], m["body"]) for m in SOLUTION.finditer(text)}


def glue_keys(code: str) -> list[str]:
    """The keys a cell glues with tx.record / tx.show (f-strings by their literal start)."""
    code = "\n".join(line for line in code.splitlines() if not line.startswith(":"))
    keys = []
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("record", "show", "show_table")):
            continue
        if node.func.attr == "record":      # show's keywords are options
            keys += [k.arg for k in node.keywords if k.arg and k.arg not in ("kind", "tol")]
        for arg in node.args[:1]:
            literals = ([arg] if not isinstance(arg, (ast.Dict, ast.DictComp)) else
                        (arg.keys if isinstance(arg, ast.Dict) else [arg.key]))
            for literal in literals:
                if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                    keys.append(literal.value)
                elif isinstance(literal, ast.JoinedStr) and literal.values:
                    first = literal.values[0]             # the literal start, then a placeholder
                    keys.append((first.value if isinstance(first, ast.Constant) else "") + "{…}")
    return keys


def test_some_part_has_exercises():
    assert PAGES, "no notebook has an exercise"


@pytest.mark.parametrize("md", PAGES, ids=[md.stem for md in PAGES])
def test_each_exercise_has_one_collapsed_solution_that_runs_code(md):
    text = md.read_text(encoding="utf-8")
    found = solutions(text)
    for label, _ in sitekit.exercises(md):
        assert label in found, f"{md.name}: exercise {label} has no solution-start/solution-end"
        options, body = found[label]
        assert ":class: dropdown" in options, f"{md.name}: the solution of {label} is not collapsed"
        assert CODE.search(body), f"{md.name}: the solution of {label} runs no code cell"
    assert len(found) == len(sitekit.exercises(md)), f"{md.name}: a solution without its exercise"


@pytest.mark.parametrize("md", PAGES, ids=[md.stem for md in PAGES])
def test_solutions_glue_only_ex_keys_and_numbers_toml_checks_them(md):
    expected = numbers.load_expected().get(md.stem, {})
    for label, (_, body) in solutions(md.read_text(encoding="utf-8")).items():
        keys = [key for cell in CODE.finditer(body) for key in glue_keys(cell["code"])]
        assert keys, f"{md.name}: the solution of {label} glues no number for the build to check"
        bad = [key for key in keys if not key.startswith("ex_")]
        assert not bad, f"{md.name}: the solution of {label} glues {bad}: keys must start with ex_"
        missing = [key for key in keys if "{" not in key and key not in expected]
        assert not missing, f"{md.name}: {missing} not in numbers.toml (run `make numbers`)"


def test_the_exercises_page_lists_every_exercise_with_its_title():
    text = ledger.exercises_text()
    for md in PAGES:
        for label, title in sitekit.exercises(md):
            assert title, f"{md.name}: exercise {label} has no title"
            assert f"- {{numref}}`{label}`: {title}\n" in text


def test_each_part_is_headed_by_its_title_not_a_comment_of_its_code():
    """The exercises page heads each part with the page's title; a `# ` line in a code cell
    (the Colab cell's first line) is a comment, not a heading."""
    text = ledger.exercises_text()
    assert "Colab only" not in text
    for md in PAGES:
        title = ledger.page_title(md)
        assert title.startswith("Part "), (md.name, title)
        assert f"## [{title}](../notebooks/{md.stem}.md)" in text


def test_the_title_is_the_first_heading_outside_code(tmp_path):
    page = tmp_path / "09_x.md"
    page.write_text("```{code-cell} ipython3\n# Colab only: a comment\nx = 1\n```\n\n"
                    "Some prose.\n\n# Part 9 · The real title\n\n## A section\n", encoding="utf-8")
    assert ledger.page_title(page) == "Part 9 · The real title"
