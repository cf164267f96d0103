"""The book as one PDF, printed by headless Chromium from the notebooks `make book` executed.

    python scripts/pdf.py            render a single-page build, print it, copy it into the site

1. Render `_build/singlehtml` with Jupyter Book's `singlehtml` builder from the jupyter-cache that
   `make book` filled. Nothing is executed again: the cache must hold an up-to-date copy of every
   notebook (checked first), and the render runs with myst-nb's executor replaced by one that
   stops the build.
2. Open it in headless Chromium (Debian's chromium + chromium-driver, as the site tests), served
   on 127.0.0.1 with every other host unreachable; wait for MathJax to typeset every formula and
   for the fonts and images to load.
3. Add a title page and a contents list (every page in _toc.yml order, with its sections), print
   once to find the page each entry starts on, write those numbers in, and print again (the two
   prints paginate alike: a number only replaces a placeholder of the same width).
   `Page.printToPDF` puts the title in the header and "page / pages" in the footer.
4. Add bookmarks that follow the contents; write `_build/pdf/why-self-attention.pdf` and copy it
   to `_build/html/`, where the intro links it.

Every failure stops with one line that says what to run.
"""

from __future__ import annotations

import base64
import functools
import http.server
import io
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import book

ROOT = book.ROOT
BUILD = book.BUILD
SINGLE = BUILD / "singlehtml"
PDF_NAME = "why-self-attention.pdf"
PDF = BUILD / "pdf" / PDF_NAME
SITE_COPY = BUILD / "html" / PDF_NAME          # the intro page links it: ../why-self-attention.pdf
ROOT_PAGE = "book/intro.html"                  # Sphinx writes the single page as the root document
ENTRY = "print.html"                           # ... whose links are relative to the build's top
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: Headless Chromium as the book drives it here and in the browser test: nothing leaves the machine
#: (every host but ours fails at once, without a DNS wait). Add a --window-size.
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
FLAGS = BROWSER_FLAGS + ["--window-size=1100,900"]
LOAD_TIMEOUT = 120       # seconds for the page, its images and MathJax's typesetting
A4 = (8.27, 11.69)       # inches
PLACEHOLDER = "000"      # a page number before the first print: as wide as any real one

#: The page header and footer of every printed page (Chromium fills the classes in).
HEADER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; margin: 0 14mm; '
          'text-align: right;"><span class="title"></span></div>')
FOOTER = ('<div style="font: 8px sans-serif; color: #555; width: 100%; text-align: center;">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')

#: Print styles on top of the theme's own: no navigation, nothing clipped, a page per chapter.
PRINT_CSS = """
@page { size: A4; }
html { font-size: 13px; }
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header-article, .bd-footer,
.bd-footer-article, .bd-footer-content, .prev-next-area, .headerlink, #jb-print-docs-body,
.pdf-download, .skip-link, .search-button, #pst-back-to-top, .toggle-hidden,
details.hide > summary, button.copybtn { display: none !important; }
.bd-main, .bd-content, .bd-article-container, .bd-page-width, .bd-container__inner,
.bd-article { max-width: none !important; width: 100% !important; padding: 0 !important;
  margin: 0 !important; overflow: visible !important; }
.pst-scrollable-table-container, .output, .cell_output, .output_html, div.highlight, pre {
  overflow: visible !important; max-height: none !important; }
pre { white-space: pre-wrap !important; word-break: break-word; }
table { font-size: 0.85rem; }
table.ledger { font-size: 0.7rem; }
table.ledger td, table.ledger th { padding: 0.15rem 0.3rem !important; }
img { max-width: 100% !important; height: auto; break-inside: avoid; }
figure, tr, .cell_input, mjx-container[display="true"] { break-inside: avoid; }
h1, h2, h3, h4 { break-after: avoid; }
/* The theme hides each first <h1> in print (it prints its own title block, hidden above). */
.bd-main .bd-content .bd-article h1:first-of-type { display: block !important; }
.print-chapter { break-before: page; }
#print-title { height: 240mm; display: flex; flex-direction: column; justify-content: center;
  text-align: center; }
#print-title h1 { font-size: 2.6rem; border: none; }
#print-title p { font-size: 1.1rem; margin: 0.4rem 0; }
#print-contents { break-before: page; }
#print-contents h1 { font-size: 1.8rem; }
#print-contents ol { list-style: none; padding: 0; margin: 0; }
#print-contents li { display: flex; align-items: baseline; margin: 0.1rem 0; }
#print-contents li.part { font-weight: bold; margin-top: 0.9rem; }
#print-contents li.chapter { font-weight: 600; margin-top: 0.4rem; }
#print-contents li.section { padding-left: 1.6rem; font-size: 0.9rem; }
#print-contents li a { color: inherit; text-decoration: none; }
#print-contents li .leader { flex: 1; border-bottom: 1px dotted #999; margin: 0 0.4rem; }
#print-contents li .page { min-width: 2.2rem; text-align: right;
  font-variant-numeric: tabular-nums; }
"""

#: Waits for the load event, MathJax's typesetting and the fonts; then says what is not right.
WAIT_JS = """
const done = arguments[arguments.length - 1];
const started = Date.now();
function finished() {
  const images = Array.from(document.images).filter(i => !i.complete || !i.naturalWidth)
    .map(i => i.getAttribute('src'));
  const raw = Array.from(document.querySelectorAll('.math'))
    .filter(e => !e.querySelector('mjx-container') && e.tagName !== 'MJX-CONTAINER').length;
  done({images: images, raw_math: raw,
        formulas: document.querySelectorAll('mjx-container').length});
}
function wait() {
  if (document.readyState === 'complete' && window.MathJax && MathJax.startup
      && MathJax.startup.promise) {
    MathJax.startup.promise.then(() => document.fonts.ready).then(finished,
      e => done({error: 'MathJax: ' + e}));
  } else if (Date.now() - started > arguments_timeout) {
    done({error: window.MathJax ? 'MathJax never started' : 'MathJax did not load'});
  } else {
    setTimeout(wait, 50);
  }
}
const arguments_timeout = arguments[0];
wait();
"""

#: Title page, contents and chapter breaks, from _toc.yml's entries (given as arguments[0]).
#: Each entry: [kind, title or null, docname or null]. Returns the contents as
#: {kind, text, target}, target being the id of the heading it links (none for a part's caption).
DRESS_JS = """
const toc = arguments[0], placeholder = arguments[1], meta = arguments[2];
const article = document.querySelector('article.bd-article');
const clean = h => h.textContent.replace(/#\\s*$/, '').trim();
const contents = document.createElement('nav');
contents.id = 'print-contents';
contents.innerHTML = '<h1>Contents</h1><ol></ol>';
const list = contents.querySelector('ol');
let n = 0;
const entries = [];
function entry(kind, text, target) {
  entries.push({kind: kind, text: text, target: target ? 'print-entry-' + n : null});
  const li = document.createElement('li');
  li.className = kind;
  if (target) {
    // Pages share section ids (each has "the-claim"): link each heading by an id of its own.
    target.id = 'print-entry-' + n;
    const a = document.createElement('a');
    a.href = '#' + target.id; a.textContent = text;
    li.appendChild(a);
    li.insertAdjacentHTML('beforeend', '<span class="leader"></span>');
    const page = document.createElement('span');
    page.className = 'page'; page.id = 'print-page-' + (n++); page.textContent = placeholder;
    page.dataset.target = target.id;
    li.appendChild(page);
  } else {
    li.textContent = text;
  }
  list.appendChild(li);
}
const missing = [];
for (const [kind, title, doc] of toc) {
  if (kind === 'part') { entry('part', title, null); continue; }
  const marker = doc === null ? null : document.getElementById('document-' + doc);
  const section = doc === null ? article.querySelector('section')
                               : (marker && marker.nextElementSibling);
  if (!section || section.tagName !== 'SECTION') { missing.push(doc); continue; }
  section.classList.add('print-chapter');
  const heading = section.querySelector('h1, h2');
  entry('chapter', clean(heading), heading);
  const level = heading.tagName === 'H1' ? 'H2' : 'H3';
  for (const sub of section.querySelectorAll(':scope > section')) {
    const h = sub.firstElementChild;
    if (h && h.tagName === level) entry('section', clean(h), h);
  }
}
// The intro's link to this very PDF: no use inside it.
for (const a of article.querySelectorAll('a[href$="why-self-attention.pdf"]')) {
  (a.closest('li') || a.closest('p') || a).remove();
}
// The ledger's status marks: emoji that the print fonts lack, as plain marks.
const marks = {'\u2705': '\u2713', '\u274c': '\u2717'};
const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (/[\u2705\u274c]/.test(node.nodeValue)) {
    node.nodeValue = node.nodeValue.replace(/[\u2705\u274c]/g, c => marks[c]);
  }
}
const title = document.createElement('div');
title.id = 'print-title';
title.innerHTML = '<h1></h1><p class="subtitle"></p><p class="author"></p><p class="built"></p>';
title.querySelector('h1').textContent = meta.title;
title.querySelector('.subtitle').textContent = meta.subtitle;
title.querySelector('.author').textContent = meta.author;
title.querySelector('.built').textContent = meta.built;
article.prepend(title, contents);
document.title = meta.title;
const style = document.createElement('style');
style.textContent = arguments[3];
document.head.appendChild(style);
return {entries: entries, missing: missing};
"""


class PdfError(book.BuildError):
    """A failure of `make pdf`, with the one line to show."""


def fail(message: str) -> None:
    """Stop with a message."""
    raise PdfError(message)


# ── 1. the single page, from the cache ────────────────────────────────────────────────────


def check_executed() -> None:
    """Every notebook has an up-to-date executed copy in the cache, and the site was built."""
    if not book.CACHE.exists():
        fail(f"no executed notebooks in {book.rel(book.CACHE)}: run `make book` first")
    try:
        book.glued_values()
    except book.BuildError as error:                # a notebook changed since it was executed
        fail(f"{str(error).split(': run', 1)[0]}: run `make book` first")
    if not (BUILD / "html" / "index.html").exists():
        fail("no built site in _build/html: run `make book` first")


def refuse_to_execute(*args, **kwargs):
    """Stands in for myst-nb's executor while the single page renders: nothing runs twice."""
    raise RuntimeError("make pdf would have executed a notebook again: its executed copy in "
                       "_build/.jupyter_cache is missing or stale. Run `make book` first.")


def html_handlers_in_singlehtml() -> None:
    """Give the singlehtml builder every extension's HTML visitors.

    Sphinx looks a node's visitor up under the builder's name and, only when no extension has
    registered any visitor under that name, under its format ("html"). sphinx-exercise registers
    its nodes for "singlehtml" too, and from then on myst-nb's nodes (HideCodeCellNode) have no
    visitor in a singlehtml build. Merge the two: the format's, then the builder's own."""
    from types import MethodType

    from sphinx.registry import SphinxComponentRegistry

    def create_translator(self, builder, *args):
        translator = self.get_translator_class(builder)(*args)
        handlers = {**self.translation_handlers.get(builder.format, {}),
                    **self.translation_handlers.get(builder.name, {})}
        for name, (visit, depart) in handlers.items():
            setattr(translator, "visit_" + name, MethodType(visit, translator))
            if depart:
                setattr(translator, "depart_" + name, MethodType(depart, translator))
        return translator

    SphinxComponentRegistry.create_translator = create_translator


def render_in_this_process() -> int:
    """Jupyter Book's singlehtml build, with notebook execution made impossible."""
    import myst_nb.core.execute.cache as cached
    from jupyter_book.cli.main import main as jupyter_book

    cached.single_nb_execution = refuse_to_execute
    html_handlers_in_singlehtml()
    try:
        jupyter_book(["build", str(ROOT), "--builder", "singlehtml", "-W", "-n", "--keep-going"],
                     standalone_mode=False)
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def render() -> None:
    """Render _build/singlehtml in a child process (its output is kept unless it fails)."""
    shutil.rmtree(SINGLE, ignore_errors=True)
    done = subprocess.run([sys.executable, __file__, "--render-only"], cwd=ROOT,
                          capture_output=True, text=True)
    output = done.stdout + done.stderr
    if "would have executed a notebook again" in output:
        fail("an executed notebook is missing or stale in _build/.jupyter_cache: "
             "run `make book` first")
    if done.returncode != 0 or not (SINGLE / ROOT_PAGE).exists():
        tail = "\n".join(output.splitlines()[-30:])
        fail(f"the single-page build failed:\n{tail}")
    # Sphinx writes book/intro.html with links relative to the top of the build (_static/,
    # _images/, book/intro.html#id): put it there, with its links to itself made links in the page.
    text = (SINGLE / ROOT_PAGE).read_text(encoding="utf-8")
    (SINGLE / ENTRY).write_text(text.replace(f'href="{ROOT_PAGE}#', 'href="#'), encoding="utf-8")
    print(f"single page: {book.rel(SINGLE / ENTRY)} (from the executed cache)")


# ── 2. the browser ────────────────────────────────────────────────────────────────────────


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serve files without a log line per request."""

    def log_message(self, *args) -> None:
        """Say nothing."""


class Server:
    """Serve a folder on 127.0.0.1 at a free port, in a thread, until stopped."""

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
    """Headless Chromium through Debian's chromedriver, with a fresh profile (and its folder)."""
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
    """_toc.yml as (kind, title, docname): the root page, then each part's caption and chapters."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [("chapter", None, None)]                      # the root page: the intro
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
    """Open the single page, wait for MathJax, dress it for print; fail on anything missing."""
    driver.get(url)
    state = driver.execute_async_script(WAIT_JS, LOAD_TIMEOUT * 1000)
    if state.get("error"):
        fail(f"the single page did not typeset its formulas ({state['error']}); is "
             f"sphinx-mathjax-offline installed (`make env`)?")
    if state["images"]:
        fail(f"{len(state['images'])} image(s) did not load: {state['images'][:3]}")
    if state["raw_math"]:
        fail(f"{state['raw_math']} formula(s) left as raw TeX after MathJax finished")
    dressed = driver.execute_script(DRESS_JS, contents_entries(), PLACEHOLDER, book_meta(),
                                    PRINT_CSS)
    if dressed["missing"]:
        fail(f"pages of _toc.yml not found in the single page: {dressed['missing']}")
    return {**state, **dressed}


def print_pdf(driver) -> bytes:
    """Print the page: A4, header and footer, background colours. Untagged: a tagged PDF is
    2.7 times the size and twice as slow to read back; the bookmarks are added afterwards."""
    options = {"paperWidth": A4[0], "paperHeight": A4[1], "marginTop": 0.6, "marginBottom": 0.6,
               "marginLeft": 0.6, "marginRight": 0.6, "printBackground": True,
               "displayHeaderFooter": True, "headerTemplate": HEADER, "footerTemplate": FOOTER,
               "generateTaggedPDF": False}
    return base64.b64decode(driver.execute_cdp_cmd("Page.printToPDF", options)["data"])


# ── 3. page numbers for the contents ──────────────────────────────────────────────────────


def link_pages(pdf: bytes) -> dict[str, int]:
    """Where each internal link of the PDF leads: {named destination: page number from 1}."""
    import logging

    from pypdf import PdfReader

    # Chromium's trailer undercounts its objects; pypdf says so and reads the file correctly.
    logging.getLogger("pypdf").setLevel(logging.ERROR)

    reader = PdfReader(io.BytesIO(pdf))
    return {str(name).lstrip("/"): reader.get_destination_page_number(dest) + 1
            for name, dest in reader.named_destinations.items()}


def fill_page_numbers(driver, pages: dict[str, int]) -> list[str]:
    """Write each contents entry's page number in; the entries whose target has no page."""
    return driver.execute_script("""
        const pages = arguments[0], missing = [];
        for (const span of document.querySelectorAll('#print-contents .page')) {
          const page = pages[span.dataset.target];
          if (page === undefined) { missing.push(span.dataset.target); continue; }
          span.textContent = String(page);
        }
        return missing;""", pages)


def finish(pdf: bytes, entries: list[dict], pages: dict[str, int]) -> bytes:
    """The printed PDF with bookmarks that follow the contents, and the book's metadata."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    meta = book_meta()
    writer.add_metadata({"/Title": meta["title"], "/Author": meta["author"],
                         "/Subject": meta["subtitle"]})
    writer.add_outline_item(title="Contents", page_number=1)
    part = chapter = None
    for item in entries:
        if item["kind"] == "part":           # a caption: it opens where its first chapter does
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
    print(f"pdf: {book.rel(PDF)}: {count} pages, {len(final) / 2**20:.1f} MiB, "
          f"{state['formulas']} formulas, {len(state['entries'])} contents entries; "
          f"copied to {book.rel(SITE_COPY)}")
    print(f"make pdf: {time.perf_counter() - start:.1f} s in all "
          f"(single page {rendered - start:.1f} s, browser and MathJax {typeset - rendered:.1f} s, "
          f"two prints {time.perf_counter() - typeset:.1f} s, the first {printed - typeset:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    """`make pdf`; a failure prints one line and returns 1."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--render-only"]:
        return render_in_this_process()
    try:
        make_pdf()
    except book.BuildError as error:
        print(f"make pdf FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
