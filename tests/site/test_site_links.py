"""Links and references of the built site, read from the HTML files (no browser).

Every internal href and src of every page names a file of the site, and every #anchor an id in
that file; the bibliography lists entries and every citation link lands on one; every notebook
page shows as many figures as its source declares; the execution page lists every notebook.
SKIPS without _build/html (run `make book`); with --require-site (.ci/run) that is a failure.
The last tests build a small broken site and check that the same functions catch each break.
"""

from __future__ import annotations

import re
from pathlib import Path

import sitekit
from sitekit import ROOT

CITE = re.compile(r"\{cite(:[a-z]+)?\}`")
PDF_NAME = "why-self-attention.pdf"   # the intro links it; it is in the site only after `make pdf`


def test_every_internal_link_and_image_resolves(site):
    pages = sitekit.html_pages(site)
    assert len(pages) >= 3, f"too few pages to be the book: {pages}"
    problems = sitekit.link_problems(site, pages)
    if not (site / PDF_NAME).exists():     # `make pdf` adds it (tests/site/test_pdf.py checks the link)
        problems = [p for p in problems if f'{PDF_NAME}"> names a missing file' not in p]
    assert not problems, f"{len(problems)} broken link(s):\n" + "\n".join(problems)


def test_no_page_loads_a_file_from_outside_the_site(site):
    """Every <script>, <link>, <img> (and iframe, source, ...) of every page names the site's own
    file: MathJax included, the site reads with no network."""
    problems = sitekit.offsite_resources(site)
    assert not problems, f"{len(problems)} off-site file(s):\n" + "\n".join(problems)
    mathjax = [page for page in sitekit.html_pages(site)
               if sitekit.parsed((site / page).resolve()).find("script", src=re.compile("mathjax"))]
    assert mathjax, "no page loads MathJax (is sphinx-mathjax-offline in _config.yml?)"
    for page in mathjax:
        src = sitekit.parsed((site / page).resolve()).find("script", src=re.compile("mathjax"))["src"]
        assert ((site / page).parent / src.split("?")[0]).resolve().is_file(), f"{page}: {src}"


def bibliography(site: Path) -> tuple[str, set[str]]:
    """The page that holds the bibliography and the ids of its entries."""
    for page in sitekit.html_pages(site):
        soup = sitekit.parsed((site / page).resolve())
        entries = {e["id"] for e in soup.select('.citation-list > .citation[id]')}
        if entries:
            return page, entries
    return "", set()


def citation_links(site: Path, page: str, bib_page: str) -> list[str]:
    """The fragments of a page's links into the bibliography page."""
    soup = sitekit.parsed((site / page).resolve())
    fragments = []
    for link in soup.find_all("a", href=True):
        found = sitekit.internal_target(site, page, link["href"])
        if found and found[0] == (site / bib_page).resolve() and found[1]:
            fragments.append(found[1])
    return fragments


def test_the_bibliography_has_entries_and_every_citation_lands_on_one(site):
    bib_page, entries = bibliography(site)
    assert bib_page and entries, "no page of the site lists bibliography entries"
    problems, cited = [], set()
    for page in sitekit.html_pages(site):
        fragments = citation_links(site, page, bib_page) if page != bib_page else []
        cited |= set(fragments)
        problems += [f"{page}: citation #{f} is not an entry of {bib_page}"
                     for f in fragments if f not in entries]
        source = sitekit.source_of(page)
        if source and CITE.search(source.read_text(encoding="utf-8")) and not fragments:
            problems.append(f"{page}: its source cites, the page links no bibliography entry")
    assert cited, "no page cites the bibliography"
    assert not problems, "\n".join(problems)


def test_the_bibliography_is_a_list_of_list_items(site):
    """Screen readers read the entries as a list: role="listitem" in role="list"
    (scripts/sphinx_ext/book_extensions.py), not docutils' deprecated role="doc-biblioentry"."""
    bib_page, _ = bibliography(site)
    soup = sitekit.parsed((site / bib_page).resolve())
    lists = soup.select(".citation-list")
    assert lists and all(lst.get("role") == "list" for lst in lists), bib_page
    roles = {entry.get("role") for lst in lists for entry in lst.find_all(recursive=False)}
    assert roles == {"listitem"}, f"{bib_page}: the entries of the bibliography have roles {roles}"


def test_every_notebook_page_shows_its_figures(site):
    problems = []
    for stem in sitekit.notebook_stems():
        page = f"notebooks/{stem}.html"
        if not (site / page).exists():
            problems.append(f"{page}: missing (is notebooks/{stem}.md in _toc.yml?)")
            continue
        wanted = sitekit.figure_cells(ROOT / "notebooks" / f"{stem}.md")
        soup = sitekit.parsed((site / page).resolve())
        shown = [img for img in soup.find_all("img", src=True) if "_images/" in img["src"]]
        if len(shown) < wanted:
            problems.append(f"{page}: {wanted} figure cells, {len(shown)} figures on the page "
                            f"(a kernel with MPLBACKEND=Agg draws none)")
    assert not problems, "\n".join(problems)


def test_the_execution_page_lists_every_notebook(site):
    page = site / "book" / "execution.html"
    assert page.exists(), "book/execution.md is not in the site (is it in _toc.yml?)"
    table = sitekit.parsed(page.resolve()).find("table")
    assert table is not None, "the execution page has no table"
    text = table.get_text(" ")
    missing = [stem for stem in sitekit.notebook_stems() if stem not in text]
    assert not missing, f"the execution table lacks {missing}"


# ── the checks catch a broken site ────────────────────────────────────────────────────────


def write(path: Path, text: str) -> None:
    """Write a file, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_link_problems_catch_each_kind_of_break(tmp_path):
    write(tmp_path / "a" / "one.html",
          '<h1 id="top">One</h1><a href="two.html#here">ok</a> <a href="two.html#gone">no anchor</a>'
          '<a href="../missing.html">no file</a> <img src="../_images/fig.png">'
          '<img src="../_images/gone.png"> <a href="#top">self</a> <a href="#nowhere">self, none</a>'
          '<a href="https://example.org/x">outside</a> <a href="mailto:a@b.c">mail</a>'
          '<script src="../_static/gone.js"></script> <a href="../">folder</a>')
    write(tmp_path / "a" / "two.html", '<p id="here">Two</p>')
    write(tmp_path / "index.html", "<p>home</p>")
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "fig.png").write_bytes(b"png")
    sitekit.parsed.cache_clear(), sitekit.ids_of.cache_clear()
    problems = sitekit.link_problems(tmp_path)
    assert sorted(re.search(r'="([^"]+)"', p).group(1) for p in problems) == [
        "#nowhere", "../_images/gone.png", "../_static/gone.js", "../missing.html", "two.html#gone"]
    assert sitekit.html_pages(tmp_path) == ["a/one.html", "a/two.html", "index.html"]


def test_the_bibliography_check_catches_a_citation_to_nowhere(tmp_path):
    write(tmp_path / "refs.html", '<div role="list" class="citation-list"><div class="citation" '
          'role="listitem" id="id1">Vaswani</div></div>')
    write(tmp_path / "page.html", '<a href="refs.html#id1">[1]</a> <a href="refs.html#id9">[9]</a>')
    sitekit.parsed.cache_clear(), sitekit.ids_of.cache_clear()
    page, entries = bibliography(tmp_path)
    assert (page, entries) == ("refs.html", {"id1"})
    assert citation_links(tmp_path, "page.html", page) == ["id1", "id9"]
    assert any("#id9" in p for p in sitekit.link_problems(tmp_path))


def test_the_offsite_check_catches_every_kind_of_outside_file(tmp_path):
    write(tmp_path / "index.html",
          '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
          '<script src="_static/mathjax/tex-chtml.js"></script><link rel="stylesheet" '
          'href="//fonts.example.org/a.css"><link rel="stylesheet" href="_static/a.css">'
          '<img src="https://example.com/x.png" alt=""><img src="data:image/png;base64,AA" alt="">'
          '<img src="_images/a.png" srcset="_images/a.png 1x, http://example.net/b.png 2x" alt="">'
          '<iframe src="https://example.org/frame"></iframe>'
          '<a href="https://colab.research.google.com/x">a link is not a request</a>')
    sitekit.parsed.cache_clear(), sitekit.ids_of.cache_clear()
    found = [re.search(r'="([^"]+)"', p).group(1) for p in sitekit.offsite_resources(tmp_path)]
    assert found == ["https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js",
                     "//fonts.example.org/a.css", "https://example.com/x.png",
                     "http://example.net/b.png", "https://example.org/frame"]


def test_no_verdict_stands_in_running_text(site):
    """The reader sees sentences, not True/False: checks run in hidden cells and the ledger."""
    problems = sitekit.verdicts_in_text(site)
    assert not problems, f"{len(problems)} True/False in running text:\n" + "\n".join(problems)


def test_the_verdict_check_finds_a_glued_boolean_in_prose(tmp_path):
    write(tmp_path / "notebooks" / "01_costs.html",
          '<main><p>The counts agree: <span class="pasted-text">True</span>.</p>'
          '<ul><li><p>It flips: False</p></li></ul>'
          '<div class="cell"><pre>print(x == y)  # True</pre><p>True</p></div>'
          '<table><tr><td>True</td></tr></table><p>Trueness is fine.</p>'
          '<p>Call it with <code class="literal">is_causal=True</code>.</p></main>')
    sitekit.parsed.cache_clear()
    problems = sitekit.verdicts_in_text(tmp_path)
    assert len(problems) == 2 and all(p.startswith("notebooks/01_costs.html") for p in problems)
