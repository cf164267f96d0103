// make pdf: title page, contents and chapter breaks from _toc.yml's entries (TOC, which
// pdf.py writes before this script, with META, the title page's text). Each entry: [kind,
// title or null, docname or null]. The contents link the headings (no page numbers: the
// PDF's bookmarks come from the headings).
(() => {
const toc = TOC, meta = META;
const article = document.querySelector('article.bd-article');
const clean = h => h.textContent.replace(/#\s*$/, '').trim();
const contents = document.createElement('nav');
contents.id = 'print-contents';
contents.innerHTML = '<h1>Contents</h1><ol></ol>';
const list = contents.querySelector('ol');
let n = 0;
function entry(kind, text, target) {
  const li = document.createElement('li');
  li.className = kind;
  if (target) {
    // Pages share section ids (each has "the-claim"): link each heading by an id of its own.
    target.id = 'print-entry-' + n;
    const a = document.createElement('a');
    a.href = '#' + target.id; a.textContent = text;
    li.appendChild(a);
    n++;
  } else {
    li.textContent = text;
  }
  list.appendChild(li);
}
for (const [kind, title, doc] of toc) {
  if (kind === 'part') { entry('part', title, null); continue; }
  const marker = doc === null ? null : document.getElementById('document-' + doc);
  const section = doc === null ? article.querySelector('section')
                               : (marker && marker.nextElementSibling);
  if (!section || section.tagName !== 'SECTION') continue;    // test_pdf.py names it
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
})();
