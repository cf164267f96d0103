"""`make pdf`: the book as one PDF. Jupyter Book's `singlehtml` build of the
executed cache (a stale notebook stops it) is written as print.html with
pdf_assets/ (print.css: dropdowns open, the title and "page / pages" in the
page margins; dress.js: a title page and contents from _toc.yml), then
printed by `chromium --headless --print-to-pdf`, bookmarks from the
headings, into _build/pdf/ and the site. tests/site/test_pdf.py checks what
the PDF holds."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from bookbuild.common import BUILD, CACHE, ROOT, book_config, fail, rel
from bookbuild.execute import require_executed
from bookbuild.site import render as render_site

ASSETS = Path(__file__).with_name("pdf_assets")
SINGLE = BUILD / "singlehtml"
PDF_NAME = "why-self-attention.pdf"
PDF = BUILD / "pdf" / PDF_NAME
# the intro page links it: ../why-self-attention.pdf
SITE_COPY = BUILD / "html" / PDF_NAME
# Sphinx writes the single page as the root document
ROOT_PAGE = "book/intro.html"
ENTRY = "print.html"      # ... whose links are relative to the build's top
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Headless Chromium as the book drives it here and in the browser test:
#: nothing leaves the machine (every host but ours fails at once, without a
#: DNS wait). Add a --window-size.
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-quic", "--no-first-run",
                 "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
#: seconds of the page's own time (its scripts, MathJax's typesetting)
#: before it prints; Chromium prints at once when nothing is left to run
LOAD_TIMEOUT = 120


def check_executed() -> None:
    """Every notebook has an up-to-date executed copy, and the site was
    built."""
    if not CACHE.exists():
        fail(f"no executed notebooks in {rel(CACHE)}: run `make book` first")
    require_executed()
    if not (BUILD / "html" / "index.html").exists():
        fail("no built site in _build/html: run `make book` first")


def contents_entries() -> list[tuple[str, str | None, str | None]]:
    """_toc.yml as (kind, title, docname): the root page, then each part's
    caption and chapters."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [("chapter", None, None)]          # the root page: the intro
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        if part.get("caption"):
            entries.append(("part", part["caption"], None))
        for chapter in part.get("chapters", []):
            entries.append(("chapter", None, chapter["file"]))
    return entries


def render() -> None:
    """Render _build/singlehtml from the cache (Jupyter Book's singlehtml
    build, which fails first if it would execute a notebook), and write
    print.html: the page with its print styles and dress.js."""
    render_site("singlehtml", fresh=True)
    config = book_config()
    meta = {"title": config["title"], "author": config.get("author", ""),
            "subtitle": "Table 1 of Attention Is All You Need, counted, "
                        "measured and checked",
            "built": f"Built {time.strftime('%Y-%m-%d', time.gmtime())} "
                     f"from the executed notebooks; every number is "
                     f"computed"}
    header = json.dumps(config["title"])
    dress = (f"<style>{(ASSETS / 'print.css').read_text(encoding='utf-8')}"
             f"@page {{ @top-right {{ content: {header}; }} }}</style>\n"
             f"<script>const TOC = {json.dumps(contents_entries())}, "
             f"META = {json.dumps(meta)};\n"
             f"{(ASSETS / 'dress.js').read_text(encoding='utf-8')}"
             f"</script>\n</body>")
    # Sphinx writes book/intro.html with links relative to the build's top
    # (_static/, _images/): put it there, its links to itself in the page.
    text = (SINGLE / ROOT_PAGE).read_text(encoding="utf-8")
    text = text.replace(f'href="{ROOT_PAGE}#', 'href="#')
    (SINGLE / ENTRY).write_text(text.replace("</body>", dress, 1),
                                encoding="utf-8")
    print(f"single page: {rel(SINGLE / ENTRY)} (from the executed cache)")


def make_pdf() -> None:
    """Everything `make pdf` does."""
    start = time.perf_counter()
    check_executed()
    if not Path(CHROMIUM).exists():
        fail(f"no {CHROMIUM}: install Debian's chromium (`make chromium`)")
    render()
    PDF.parent.mkdir(parents=True, exist_ok=True)
    PDF.unlink(missing_ok=True)
    done = subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, "--allow-file-access-from-files",
         "--no-pdf-header-footer", "--generate-pdf-document-outline",
         f"--virtual-time-budget={LOAD_TIMEOUT * 1000}",
         f"--print-to-pdf={PDF}", (SINGLE / ENTRY).as_uri()],
        capture_output=True, text=True, timeout=LOAD_TIMEOUT + 60)
    if done.returncode != 0 or not PDF.exists():
        fail(f"chromium printed no PDF (exit {done.returncode}): "
             f"{done.stderr.strip().splitlines()[-1:]}")
    shutil.copyfile(PDF, SITE_COPY)
    print(f"pdf: {rel(PDF)}: {PDF.stat().st_size / 2**20:.1f} MiB; copied "
          f"to {rel(SITE_COPY)}; {time.perf_counter() - start:.1f} s")
