"""The book as one PDF, printed by headless Chromium from the notebooks
`make book` executed.

    python scripts/book.py pdf           render a single-page build, print it, copy it into the site

1. Render `_build/singlehtml` with Jupyter Book's `singlehtml` builder from
   the jupyter-cache that
   `make book` filled. Nothing is executed again: the cache must hold an up-to-date copy of every
   notebook (checked first, as for the site). Every dropdown (a solution, an aside) prints open
   (pdf_assets/print.css).
2. Open it in headless Chromium (Debian's chromium + chromium-driver, as the
   site tests), served
   on 127.0.0.1 with every other host unreachable; wait for MathJax to typeset every formula and
   for the fonts and images to load.
3. Add a title page and a contents list (every page in _toc.yml order, with
   its sections), print
   once to find the page each entry starts on, write those numbers in, and print again (the two
   prints paginate alike: a number only replaces a placeholder of the same width).
   `Page.printToPDF` puts the title in the header and "page / pages" in the footer.
4. Add bookmarks that follow the contents; write
   `_build/pdf/why-self-attention.pdf` and copy it
   to `_build/html/`, where the intro links it.

Every failure stops with one line that says what to run.
"""

from __future__ import annotations

import base64
import functools
import http.server
import io
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bookbuild.common import BUILD, CACHE, ROOT, BuildError, rel
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
FLAGS = BROWSER_FLAGS + ["--window-size=1100,900"]
LOAD_TIMEOUT = 120       # seconds for the page, its images and MathJax's typesetting
A4 = (8.27, 11.69)       # inches
# a page number before the first print: as wide as any real one
PLACEHOLDER = "000"

#: The page header and footer of every printed page (Chromium fills the
#: classes in).
HEADER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; margin: 0 14mm; '
          'text-align: right;"><span class="title"></span></div>')
FOOTER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; text-align: center;">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')





def asset(name: str) -> str:
    """A print style or a script of pdf_assets/."""
    return (ASSETS / name).read_text(encoding="utf-8")


class PdfError(BuildError):
    """A failure of `make pdf`, with the one line to show."""


def fail(message: str) -> None:
    """Stop with a message."""
    raise PdfError(message)


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
    try:
        render_site("singlehtml", fresh=True)
    except PdfError:
        raise
    except BuildError as error:
        fail(str(error))
    # Sphinx writes book/intro.html with links relative to the build's top
    # (_static/, _images/): put it there, its links to itself in the page.
    text = (SINGLE / ROOT_PAGE).read_text(encoding="utf-8")
    (SINGLE / ENTRY).write_text(text.replace(f'href="{ROOT_PAGE}#', 'href="#'),
                                encoding="utf-8")
    print(f"single page: {rel(SINGLE / ENTRY)} (from the executed cache)")


# ── 2. the browser ────────────────────────────────────────────────────────────────────────


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serve files without a log line per request."""

    def log_message(self, *args) -> None:
        """Say nothing."""


class Server:
    """Serve a folder on 127.0.0.1 at a free port, in a thread, until
    stopped."""

    def __init__(self, folder: Path):
        handler = functools.partial(QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


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
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
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
    dressed = driver.execute_script(asset("dress.js"), contents_entries(), PLACEHOLDER,
                                    book_meta(), asset("print.css"))
    if dressed["missing"]:
        fail(f"pages of _toc.yml not found in the single page: {dressed['missing']}")
    return {**state, **dressed}


def print_pdf(driver) -> bytes:
    """Print the page: A4, header and footer, background colours. Untagged:
    a tagged PDF is 2.7 times the size and twice as slow to read back; the
    bookmarks are added afterwards."""
    options = {"paperWidth": A4[0], "paperHeight": A4[1], "marginTop": 0.6, "marginBottom": 0.6,
               "marginLeft": 0.6, "marginRight": 0.6, "printBackground": True,
               "displayHeaderFooter": True, "headerTemplate": HEADER, "footerTemplate": FOOTER,
               "generateTaggedPDF": False}
    return base64.b64decode(driver.execute_cdp_cmd("Page.printToPDF", options)["data"])


# ── 3. page numbers for the contents ──────────────────────────────────────────────────────


def link_pages(pdf: bytes) -> dict[str, int]:
    """Where each internal link of the PDF leads: {named destination: page
    number from 1}."""
    import logging

    from pypdf import PdfReader

    # Chromium's trailer undercounts its objects; pypdf says so and reads
    # the file correctly.
    logging.getLogger("pypdf").setLevel(logging.ERROR)

    reader = PdfReader(io.BytesIO(pdf))
    return {str(name).lstrip("/"): reader.get_destination_page_number(dest) + 1
            for name, dest in reader.named_destinations.items()}


def fill_page_numbers(driver, pages: dict[str, int]) -> list[str]:
    """Write each contents entry's page number in; the entries whose target
    has no page."""
    return driver.execute_script("""
        const pages = arguments[0], missing = [];
        for (const span of document.querySelectorAll('#print-contents .page')) {
          const page = pages[span.dataset.target];
          if (page === undefined) { missing.push(span.dataset.target); continue; }
          span.textContent = String(page);
        }
        return missing;""", pages)


def finish(pdf: bytes, entries: list[dict], pages: dict[str, int]) -> bytes:
    """The printed PDF with bookmarks that follow the contents, and the
    book's metadata."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    meta = book_meta()
    writer.add_metadata({"/Title": meta["title"], "/Author": meta["author"],
                         "/Subject": meta["subtitle"]})
    writer.add_outline_item(title="Contents", page_number=1)
    part = chapter = None
    for item in entries:
        # a caption: it opens where its first chapter does
        if item["kind"] == "part":
            following = entries[entries.index(item) + 1:]
            first = next((e for e in following if e["target"]), None)
            part = (writer.add_outline_item(title=item["text"],
                                            page_number=pages[first["target"]] - 1)
                    if first else None)
        elif item["kind"] == "chapter":
            chapter = writer.add_outline_item(title=item["text"],
                                              page_number=pages[item["target"]] - 1, parent=part)
        else:
            writer.add_outline_item(title=item["text"], page_number=pages[item["target"]] - 1,
                                    parent=chapter)
    writer.page_mode = "/UseOutlines"
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


# ── all of it ─────────────────────────────────────────────────────────────────────────────


def make_pdf() -> None:
    """Everything `make pdf` does."""
    start = time.perf_counter()
    check_executed()
    render()
    rendered = time.perf_counter()
    driver, profile = browser()
    try:
        with Server(SINGLE) as server:
            state = prepare(driver, f"{server.url}/{ENTRY}")
            typeset = time.perf_counter()
            first = print_pdf(driver)
            printed = time.perf_counter()
            pages = link_pages(first)
            missing = fill_page_numbers(driver, pages)
            if missing:
                fail(f"the first print has no page for contents entries {missing[:5]}")
            final = finish(print_pdf(driver), state["entries"], pages)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    PDF.parent.mkdir(parents=True, exist_ok=True)
    PDF.write_bytes(final)
    shutil.copyfile(PDF, SITE_COPY)
    from pypdf import PdfReader

    count = len(PdfReader(io.BytesIO(final)).pages)
    print(f"pdf: {rel(PDF)}: {count} pages, {len(final) / 2**20:.1f} MiB, "
          f"{state['formulas']} formulas, {len(state['entries'])} contents entries; "
          f"copied to {rel(SITE_COPY)}")
    print(f"make pdf: {time.perf_counter() - start:.1f} s in all "
          f"(single page {rendered - start:.1f} s, browser and MathJax {typeset - rendered:.1f} s, "
          f"two prints {time.perf_counter() - typeset:.1f} s, the first {printed - typeset:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    """`make pdf`; a failure prints one line and returns 1."""
    try:
        make_pdf()
    except BuildError as error:
        print(f"make pdf FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
