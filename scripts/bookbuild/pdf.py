"""The book as one PDF, printed by headless Chromium from the notebooks
`make book` executed.

    python scripts/book.py pdf           render a single-page build, print it, copy it into the site

1. Render `_build/singlehtml` with Jupyter Book's `singlehtml` builder from
   the jupyter-cache `make book` filled (nothing is executed again; a stale
   notebook stops it). Every dropdown prints open (pdf_assets/print.css).
2. Open it as a file in headless Chromium (Debian's chromium and
   chromium-driver), every host unreachable; wait for MathJax, the fonts
   and the images.
3. Add a title page and a contents list with links (pdf_assets/dress.js),
   and print once with `Page.printToPDF`: the title in the header, "page /
   pages" in the footer, bookmarks from the headings
   (`generateDocumentOutline`). Write `_build/pdf/why-self-attention.pdf`
   and copy it to `_build/html/`, where the intro links it.

Every failure stops with one line that says what to run.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from pathlib import Path

from bookbuild.common import (
    BUILD,
    CACHE,
    ROOT,
    BuildError,
    book_config,
    fail,
    rel,
)
from bookbuild.execute import glued_values
from bookbuild.site import render as render_site

ASSETS = Path(__file__).with_name("pdf_assets")
SINGLE = BUILD / "singlehtml"
PDF_NAME = "why-self-attention.pdf"
PDF = BUILD / "pdf" / PDF_NAME
# the intro page links it: ../why-self-attention.pdf
SITE_COPY = BUILD / "html" / PDF_NAME
# Sphinx writes the single page as the root document
ROOT_PAGE = "book/intro.html"
ENTRY = "print.html"                           # ... whose links are relative to the build's top
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: Headless Chromium as the book drives it here and in the browser test:
#: nothing leaves the machine (every host but ours fails at once, without a
#: DNS wait). Add a --window-size.
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
# file:// pages may load their fonts and scripts
FLAGS = BROWSER_FLAGS + ["--window-size=1100,900",
                         "--allow-file-access-from-files"]
LOAD_TIMEOUT = 120       # seconds for the page, its images and MathJax's typesetting
A4 = (8.27, 11.69)       # inches

#: The page header and footer of every printed page (Chromium fills the
#: classes in).
HEADER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; margin: 0 14mm; '
          'text-align: right;"><span class="title"></span></div>')
FOOTER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; text-align: center;">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


def asset(name: str) -> str:
    """A print style or a script of pdf_assets/."""
    return (ASSETS / name).read_text(encoding="utf-8")


# ── 1. the single page, from the cache ────────────────────────────────────────────────────


def check_executed() -> None:
    """Every notebook has an up-to-date executed copy, and the site was
    built."""
    if not CACHE.exists():
        fail(f"no executed notebooks in {rel(CACHE)}: run `make book` first")
    try:
        glued_values()
    except BuildError as error:            # a notebook changed since
        fail(f"{str(error).split(': run', 1)[0]}: run `make book` first")
    if not (BUILD / "html" / "index.html").exists():
        fail("no built site in _build/html: run `make book` first")


def render() -> None:
    """Render _build/singlehtml from the cache: Jupyter Book's singlehtml
    build, which fails first if it would execute a notebook."""
    render_site("singlehtml", fresh=True)
    # Sphinx writes book/intro.html with links relative to the build's top
    # (_static/, _images/): put it there, its links to itself in the page.
    text = (SINGLE / ROOT_PAGE).read_text(encoding="utf-8")
    (SINGLE / ENTRY).write_text(text.replace(f'href="{ROOT_PAGE}#', 'href="#'),
                                encoding="utf-8")
    print(f"single page: {rel(SINGLE / ENTRY)} (from the executed cache)")


# ── 2. the browser ────────────────────────────────────────────────────────────────────────


def browser():
    """Headless Chromium through Debian's chromedriver, with a fresh profile
    (and its folder)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    if missing:
        fail(f"no {' or '.join(missing)}: install Debian's chromium and chromium-driver "
             f"(apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-pdf-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(LOAD_TIMEOUT)
    driver.set_script_timeout(LOAD_TIMEOUT + 10)
    return driver, profile


def contents_entries() -> list[tuple[str, str | None, str | None]]:
    """_toc.yml as (kind, title, docname): the root page, then each part's
    caption and chapters."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    # the root page: the intro
    entries = [("chapter", None, None)]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        if part.get("caption"):
            entries.append(("part", part["caption"], None))
        for chapter in part.get("chapters", []):
            entries.append(("chapter", None, chapter["file"]))
    return entries


def book_meta() -> dict[str, str]:
    """Title page text from _config.yml."""
    config = book_config()
    return {"title": config["title"], "author": config.get("author", ""),
            "subtitle": "Table 1 of Attention Is All You Need, counted, measured and checked",
            "built": f"Built {time.strftime('%Y-%m-%d', time.gmtime())} from the executed "
                     f"notebooks; every number is computed"}


def prepare(driver, url: str) -> dict:
    """Open the single page, wait for MathJax, dress it for print; fail on
    anything missing."""
    driver.get(url)
    state = driver.execute_async_script(asset("wait.js"), LOAD_TIMEOUT * 1000)
    if state.get("error"):
        fail(f"the single page did not typeset its formulas ({state['error']}); is "
             f"sphinx-mathjax-offline installed (`make env`)?")
    if state["images"]:
        fail(f"{len(state['images'])} image(s) did not load: {state['images'][:3]}")
    if state["raw_math"]:
        fail(f"{state['raw_math']} formula(s) left as raw TeX after MathJax finished")
    dressed = driver.execute_script(asset("dress.js"), contents_entries(),
                                    book_meta(), asset("print.css"))
    if dressed["missing"]:
        fail(f"pages of _toc.yml not found in the single page: {dressed['missing']}")
    return {**state, **dressed}


def print_pdf(driver) -> bytes:
    """Print the page: A4, header and footer, background colours, the
    headings as bookmarks (which need a tagged PDF)."""
    options = {"paperWidth": A4[0], "paperHeight": A4[1],
               "marginTop": 0.6, "marginBottom": 0.6, "marginLeft": 0.6,
               "marginRight": 0.6, "printBackground": True,
               "displayHeaderFooter": True, "headerTemplate": HEADER,
               "footerTemplate": FOOTER, "generateTaggedPDF": True,
               "generateDocumentOutline": True}
    printed = driver.execute_cdp_cmd("Page.printToPDF", options)
    return base64.b64decode(printed["data"])


def make_pdf() -> None:
    """Everything `make pdf` does."""
    start = time.perf_counter()
    check_executed()
    render()
    driver, profile = browser()
    try:
        state = prepare(driver, (SINGLE / ENTRY).as_uri())
        printed = print_pdf(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    PDF.parent.mkdir(parents=True, exist_ok=True)
    PDF.write_bytes(printed)
    shutil.copyfile(PDF, SITE_COPY)
    print(f"pdf: {rel(PDF)}: {len(printed) / 2**20:.1f} MiB, "
          f"{state['formulas']} formulas, {len(state['entries'])} contents "
          f"entries; copied to {rel(SITE_COPY)}; "
          f"{time.perf_counter() - start:.1f} s")
