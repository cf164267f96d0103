"""A Sphinx extension of the book: the bibliography as a list that assistive technology can read.

docutils 0.21 writes each entry of the bibliography (sphinxcontrib-bibtex's citation nodes) as
<div role="doc-biblioentry"> inside <div role="list">. DPUB-ARIA 1.1 deprecates doc-biblioentry,
and a list whose children are not list items is not a list to a screen reader: axe-core reports
aria-required-children (critical) on the list, aria-allowed-role and aria-deprecated-role (minor)
on every entry. This extension writes the same elements, ids and classes (the theme's styles still
apply), each entry with role="listitem".
"""

from docutils import nodes


def visit_citation(self, node) -> None:
    """Open the list before the first of adjacent entries, then the entry as a list item."""
    if not isinstance(node.previous_sibling(), type(node)):
        self.body.append('<div role="list" class="citation-list">\n')
    self.body.append(self.starttag(node, "div", classes=[node.tagname], role="listitem"))


def depart_citation(self, node) -> None:
    """Close the entry, and the list after the last of adjacent entries."""
    self.body.append("</div>\n")
    if not isinstance(node.next_node(descend=False, siblings=True), type(node)):
        self.body.append("</div>\n")


def setup(app):
    """Replace the HTML writer's handlers of citation nodes (any HTML translator, any theme)."""
    app.add_node(nodes.citation, override=True, html=(visit_citation, depart_citation))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
