"""Shared by the three groups of tests (helpers/, build/, site/): the
build's modules (scripts/) and the site tests' kit on the path."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "site"))


def pytest_addoption(parser):
    """--require-site: CI passes it after `make book`; a missing site or
    browser then fails."""
    parser.addoption("--require-site", action="store_true", default=False,
                     help="the site tests must run: no _build/html or no "
                          "chromium is a failure, not a skip")


@pytest.fixture(scope="session")
def run_alone(tmp_path_factory):
    """A function: `path` (.md or .ipynb) executed alone in an empty
    folder by the build's own execution (execute.run), with `env` in the
    kernel's environment, into a cache of its own; returns the executed
    notebook (a failing cell raises BuildError, quoting it)."""
    from jupyter_cache import get_cache

    from bookbuild import execute

    def run(path: Path, env: dict[str, str] | None = None):
        cache = get_cache(str(tmp_path_factory.mktemp("cache")))
        reader = {"read_data": execute.READER} if path.suffix == ".md" else {}
        cache.add_nb_to_project(str(path), **reader)
        execute.run(cache, env=env)
        record = cache.get_cached_project_nb(str(path))
        return cache.get_cache_bundle(record.pk).nb

    return run


@pytest.fixture(scope="module")
def site(request) -> Path:
    """The built site, fresh, or a skip (a failure with --require-site).
    The browser test overrides it with the site served on 127.0.0.1."""
    import sitekit

    return sitekit.fresh_site_or_skip(request.config, sitekit.HTML)
