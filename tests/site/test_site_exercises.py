"""On the built pages, every solution is collapsed (a toggled dropdown) and follows its exercise.
SKIPS without _build/html (run `make book`); with --require-site (.ci/run) that is a failure."""

from __future__ import annotations

import pytest

import sitekit
from bookbuild import common, ledger

PAGES = [md.stem for md in common.notebook_sources() if sitekit.exercises(md)]


@pytest.mark.parametrize("stem", PAGES)
def test_solutions_are_collapsed_on_the_page(site, stem):
    soup = sitekit.parsed((site / "notebooks" / f"{stem}.html").resolve())
    exercises, found = soup.select("div.exercise"), soup.select("div.solution")
    assert len(exercises) == len(sitekit.exercises(common.NOTEBOOKS / f"{stem}.md")), stem
    assert len(found) == len(exercises), f"{stem}: {len(found)} solutions for {len(exercises)} exercises"
    for solution in found:
        assert "dropdown" in solution.get("class", []), f"{stem}: a solution is not collapsed"
    assert soup.select_one('script[src*="togglebutton"]'), f"{stem}: no toggle script to collapse them"


def test_the_exercises_page_names_each_part_and_each_exercise(site):
    """Each part under its title (not the Colab cell's comment), each exercise as a link that
    reads "Exercise N", its title and its question."""
    soup = sitekit.parsed((site / "book" / "exercises.html").resolve())
    headings = [h.get_text(" ", strip=True).rstrip("#").strip() for h in soup.select("main h2")]
    assert not [h for h in headings if "Colab" in h], headings
    plain = str.maketrans("’‘“”", "''\"\"")         # Sphinx sets quote marks typographically
    items = [li.get_text(" ", strip=True).translate(plain) for li in soup.select("main li")]
    for stem in PAGES:
        md = common.NOTEBOOKS / f"{stem}.md"
        assert any(ledger.page_title(md) in h for h in headings), (stem, headings)
        questions = {m["label"]: m["body"] for m in
                     ledger.EXERCISE.finditer(md.read_text(encoding="utf-8"))}
        for label, title in sitekit.exercises(md):
            # the question's first words, as text (no math, no markup)
            words = " ".join(questions[label].split()[:3])
            assert any(item.startswith("Exercise ") and title in item
                       and (words in item or "$" in words or "`" in words)
                       for item in items), (label, title)
