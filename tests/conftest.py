"""Shared fixtures: the repository root on the path, so that tests import scripts/book.py."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def pytest_addoption(parser):
    """--require-site: .ci/run passes it after `make book`; a missing site or browser then fails."""
    parser.addoption("--require-site", action="store_true", default=False,
                     help="the site tests must run: no _build/html or no chromium is a failure, "
                          "not a skip (CI, after `make book`)")
