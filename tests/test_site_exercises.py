"""On the built pages, every solution is collapsed (a toggled dropdown) and follows its exercise.
SKIPS without _build/html (run `make book`); with --require-site (.ci/run) that is a failure."""

from __future__ import annotations

import pytest

import book
import sitekit
from sitekit import HTML

PAGES = [md.stem for md in book.notebook_sources() if book.exercises(md)]


@pytest.fixture(scope="module")
def site(request):
    return sitekit.fresh_site_or_skip(request.config, HTML)


@pytest.mark.parametrize("stem", PAGES)
def test_solutions_are_collapsed_on_the_page(site, stem):
    soup = sitekit.parsed((site / "notebooks" / f"{stem}.html").resolve())
    exercises, found = soup.select("div.exercise"), soup.select("div.solution")
    assert len(exercises) == len(book.exercises(book.NOTEBOOKS / f"{stem}.md")), stem
    assert len(found) == len(exercises), f"{stem}: {len(found)} solutions for {len(exercises)} exercises"
    for solution in found:
        assert "dropdown" in solution.get("class", []), f"{stem}: a solution is not collapsed"
    assert soup.select_one('script[src*="togglebutton"]'), f"{stem}: no toggle script to collapse them"
