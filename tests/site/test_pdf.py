"""The book as a PDF: `make pdf`'s _build/pdf/why-self-attention.pdf, read back with pypdf.

It holds every page of _toc.yml in order, each with a bookmark (from its heading) where it
starts; every page carries "page / pages"; every dropdown prints open; the numbers the prose
pastes and the tables show are there as text, as numbers.toml promises them; no formula is left as
raw TeX; every figure is there; the site links the PDF.
SKIPS without the PDF, or with one older than the site (run `make book`, then `make pdf`); with
--require-site (.ci/run, after `make pdf`) both are failures. The last tests need no PDF: `make pdf`
without an executed build, or with a stale notebook, stops with one line that says what to run.
"""

from __future__ import annotations

import functools
import re
import shutil
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import book
import sitekit
from bookbuild import common, execute, pdf
from sitekit import HTML, ROOT

PDF = pdf.PDF


def flat(text: str) -> str:
    """Text as a reader would type it: ligatures undone (the PDF's "ﬁ" is "fi"), every run of
    whitespace one space (lines wrap where the page says)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass(eq=False)
class Printed:
    """The PDF, its pages' text (read on demand: a page takes pypdf a fraction of a second)."""
    reader: object
    texts: dict[int, str] = field(default_factory=dict)

    def text(self, index: int) -> str:
        """The text of one page (0-based), whitespace flattened."""
        if index not in self.texts:
            self.texts[index] = flat(self.reader.pages[index].extract_text())
        return self.texts[index]

    @property
    def count(self) -> int:
        """How many pages."""
        return len(self.reader.pages)


@pytest.fixture(scope="module")
def printed(request) -> Printed:
    """The PDF of the last `make pdf`, fresh, or a skip (a failure with --require-site)."""
    from pypdf import PdfReader

    config = request.config
    if not PDF.exists():
        sitekit.skip_or_fail(config, f"no {common.rel(PDF)}: run `make book`, then `make pdf`")
    site = HTML / "index.html"
    if not site.exists() or PDF.stat().st_mtime < site.stat().st_mtime:
        sitekit.skip_or_fail(config, f"{common.rel(PDF)} is older than the site (or there is no "
                             f"site): run `make pdf` after `make book`")
    return Printed(PdfReader(PDF))


def toc_pages() -> list[str]:
    """The pages of _toc.yml in order: the root, then every chapter."""
    return [doc for kind, _, doc in pdf.contents_entries() if kind == "chapter"]


def heading(tag) -> str:
    """A heading's text without the theme's "#" link."""
    return flat(tag.get_text(" ")).removesuffix("#").strip()


@functools.cache
def site_titles() -> list[tuple[str, list[str]]]:
    """Each page of _toc.yml as the site shows it: (title, its section headings), in order."""
    root = pdf.ROOT_PAGE.removesuffix(".html")
    found = []
    for doc in toc_pages():
        soup = sitekit.parsed((HTML / f"{doc or root}.html").resolve())
        found.append((heading(soup.select_one("article h1")),
                      [heading(h) for h in soup.select("article section > h2")]))
    return found


@functools.cache
def bookmarks(printed: Printed) -> list[tuple[str, int]]:
    """The PDF's outline, flattened in order: (title, page number)."""
    marks = []

    def walk(items):
        for item in items:
            if isinstance(item, list):
                walk(item)
            else:
                marks.append((flat(item.title).removesuffix("#").strip(),
                              printed.reader.get_destination_page_number(item) + 1))
    walk(printed.reader.outline)
    return marks


def chapter_starts(printed: Printed) -> list[int | None]:
    """The page of each page of _toc.yml's bookmark, in order (None: no bookmark). Read in
    order: a later heading may repeat a title (the exercises page has a section per part)."""
    marks, starts, at = bookmarks(printed), [], 0
    for title, _ in site_titles():
        found = next((i for i in range(at, len(marks)) if marks[i][0] == title), None)
        starts.append(None if found is None else marks[found][1])
        at = at if found is None else found + 1
    return starts


def chapter_ranges(printed: Printed) -> dict[str, range]:
    """Each page of _toc.yml: the 0-based page indices it covers in the PDF."""
    starts = [page - 1 for page in chapter_starts(printed)]
    ends = starts[1:] + [printed.count]
    return {doc or "book/intro": range(start, end)
            for doc, start, end in zip(toc_pages(), starts, ends)}


# ── the PDF ───────────────────────────────────────────────────────────────────────────────


def test_every_page_has_a_bookmark_in_toc_order_where_it_starts(printed):
    problems, previous = [], 0
    for (title, _), page in zip(site_titles(), chapter_starts(printed)):
        if page is None:
            problems.append(f"no bookmark {title!r} (after page {previous})")
            continue
        if page <= previous:
            problems.append(f"{title!r} on page {page}, not after page {previous}: not TOC order")
        previous = page
        if title not in printed.text(page - 1):
            problems.append(f"the bookmark puts {title!r} on page {page}, which lacks it")
    assert not problems, "\n".join(problems)


def test_the_page_count_holds_every_page(printed):
    ranges = chapter_ranges(printed)
    assert len(ranges) == len(toc_pages()) >= 10
    assert all(len(pages) >= 1 for pages in ranges.values()), ranges
    assert printed.count >= 2 + len(ranges), printed.count        # title, contents, the pages


def test_every_page_shows_its_number_and_the_count(printed):
    """The footer "n / N": on every page but the ledger's middle (1 s a page to read, no more
    to learn than from its first and last pages)."""
    ledger = chapter_ranges(printed)["book/ledger"]
    wanted = [i for i in range(printed.count) if i not in ledger[1:-1]]
    missing = [i + 1 for i in wanted
               if not re.search(rf"(?<![\d,.]){i + 1} / {printed.count}(?![\d,.])", printed.text(i))]
    assert not missing, f"pages without their number in the footer: {missing}"


def prose_pastes(source: Path, expected: dict) -> list[tuple[str, str]]:
    """(key, text) for every number the source's prose pastes, formatted from numbers.toml;
    measured values (this machine's clock) and seeded ones with a tolerance wider than their
    printed digits (a chaotic chain: ex_scale_3_0, tol 0.5) have no fixed text: left out."""
    pastes = []
    for doc, key, spec in sitekit.glue_roles(source.read_text(encoding="utf-8")):
        entry = expected.get(doc or source.stem, {}).get(key)
        loose = entry is not None and (entry.get("tol") or 0) >= 0.01
        if entry is not None and entry["kind"] != "measured" and not loose:
            pastes.append((f"{doc or source.stem}::{key}", sitekit.format_glued(entry["value"], spec)))
    return pastes


def test_the_glued_numbers_are_in_the_pdf_as_text(printed):
    expected = tomllib.loads((ROOT / "numbers.toml").read_text(encoding="utf-8"))
    crossing = f"{expected['01_costs']['crossing']['value']:,}"     # Part 1: where pairs take over
    ranges = chapter_ranges(printed)
    part1 = " ".join(printed.text(i) for i in ranges["notebooks/01_costs"])
    assert crossing in part1, f"Part 1's crossing {crossing} is not in its pages"
    problems, checked = [], 0
    for doc, pages in ranges.items():
        source = ROOT / f"{doc}.md"
        text = " ".join(printed.text(i) for i in pages) if doc != "book/ledger" else ""
        # a line may break after a hyphen ("1.9e-" / "09"): joined again
        joined = re.sub(r"-\s+", "-", text)
        for key, pasted in prose_pastes(source, expected) if text else []:
            checked += 1
            if pasted not in text and pasted not in joined:
                problems.append(f"{doc}: {key} = {pasted!r} is not in its pages "
                                f"{pages.start + 1}-{pages.stop}")
    assert checked >= 100, f"only {checked} glued numbers checked"
    assert not problems, f"{len(problems)} glued number(s) missing:\n" + "\n".join(problems)


def test_the_tables_numbers_are_in_the_pdf(printed):
    """Every exact whole-number table cell of numbers.toml (keys table.row.column) of four
    digits or more, written with thousands separators, is on its part's pages."""
    expected = tomllib.loads((ROOT / "numbers.toml").read_text(encoding="utf-8"))
    ranges = chapter_ranges(printed)
    problems, checked = [], 0
    for stem, keys in expected.items():
        text = " ".join(printed.text(i) for i in ranges[f"notebooks/{stem}"])
        for key, entry in keys.items():
            value = entry.get("value")
            if key.count(".") == 2 and entry["kind"] == "exact" and type(value) is int \
                    and abs(value) >= 1000:
                checked += 1
                if f"{value:,}" not in text:
                    problems.append(f"{stem}: table cell {key} = {value:,} is not in its pages")
    assert checked >= 20, f"only {checked} table cells checked"
    assert not problems, "\n".join(problems)


def test_no_formula_is_left_as_raw_tex(printed):
    """MathJax typeset every formula before printing: no TeX delimiter or command is text."""
    raw = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\(cdot|frac|log|times|mathcal)\b")
    pages = [i + 1 for i in range(printed.count) if raw.search(printed.text(i))]
    assert not pages, f"raw TeX on pages {pages}"


def test_every_figure_is_in_the_pdf(printed):
    wanted = sum(sitekit.figure_cells(ROOT / "notebooks" / f"{stem}.md")
                 for stem in sitekit.notebook_stems())
    images = 0
    for page in printed.reader.pages:
        objects = page.get("/Resources", {}).get("/XObject", {})
        images += sum(1 for ref in objects.values() if ref.get_object().get("/Subtype") == "/Image")
    assert wanted and images >= wanted, f"{images} images in the PDF, {wanted} figure cells"


def test_the_site_links_the_pdf(printed):
    copy = HTML / pdf.PDF_NAME
    assert copy.is_file() and copy.read_bytes() == PDF.read_bytes(), \
        f"{common.rel(copy)} is missing or not the PDF of {common.rel(PDF)}: run `make pdf`"
    intro = HTML / pdf.ROOT_PAGE
    links = [a["href"] for a in sitekit.parsed(intro.resolve()).find_all("a", href=True)
             if a["href"].endswith(pdf.PDF_NAME)]
    assert links, f"{common.rel(intro)} does not link {pdf.PDF_NAME}"
    assert all((intro.parent / href).resolve() == copy.resolve() for href in links), links


# ── make pdf stops clearly ────────────────────────────────────────────────────────────────


def test_make_pdf_without_an_executed_build_says_what_to_run(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(execute, "CACHE", tmp_path / "no-cache")
    monkeypatch.setattr(execute, "STAMP", tmp_path / "no-stamp")
    assert book.main(["pdf"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run `make book`" in err, err


def test_make_pdf_with_a_stale_notebook_says_what_to_run(monkeypatch, tmp_path, capsys):
    """A notebook changed since `make book` has no executed copy: stop before rendering it."""
    if not common.CACHE.exists():
        pytest.skip("no executed build in _build/.jupyter_cache: run `make book`")
    source = common.notebook_sources()[0]
    changed = tmp_path / source.name
    shutil.copyfile(source, changed)
    changed.write_text(source.read_text(encoding="utf-8").replace(
        "```{code-cell} ipython3\n", "```{code-cell} ipython3\nchanged_since_the_build = 1\n", 2),
        encoding="utf-8")
    monkeypatch.setattr(common, "notebook_sources", lambda: [changed])
    monkeypatch.setattr(pdf, "render", lambda: pytest.fail("rendered from a stale cache"))
    try:
        assert book.main(["pdf"]) == 1
    finally:  # leave the book's cache as it was: no stray notebook in its project
        from jupyter_cache import get_cache
        cache = get_cache(str(common.CACHE))
        if any(r.uri == str(changed) for r in cache.list_project_records()):
            cache.remove_nb_from_project(str(changed))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and source.name in err and "run `make book`" in err, err


def test_every_dropdown_prints_open(printed):
    """Collapsed on the site, open in the PDF (pdf_assets/print.css): the
    exercises' solutions and any aside written as an {admonition} with
    :class: dropdown. The first sentence of each, where it is plain text,
    is in the PDF."""
    soup = sitekit.parsed(pdf.SINGLE / pdf.ENTRY)
    dropdowns = soup.select("div.dropdown")
    assert dropdowns, "no dropdown in the single page"
    text = " ".join(printed.text(i) for i in range(printed.count))
    missing, checked = [], 0
    for dropdown in dropdowns:
        first = next((p for p in dropdown.find_all("p")
                      if "admonition-title" not in (p.get("class") or [])
                      and not p.select(".math, code")), None)
        if first is None:
            continue
        words = " ".join(flat(first.get_text("")).split()[:6])
        checked += 1
        if words not in text:
            missing.append(words)
    assert checked and not missing, missing[:5]
