"""`make compat`'s own parts (scripts/bookbuild/compat.py), and the helpers' reading of caches that older
transformers releases shape differently. The environments themselves are built by `make compat`."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tx_part4 as tx
from bookbuild import compat

ROOT = Path(__file__).resolve().parents[2]


def test_the_declared_lower_bounds_are_read_from_pyproject():
    for name in ("torch", "transformers"):
        assert re.fullmatch(r"\d+(\.\d+)+", compat.lowest_declared(name)), name


def test_a_package_without_a_lower_bound_is_an_error():
    with pytest.raises(compat.BuildError, match="numpy"):
        compat.lowest_declared("numpy")            # declared, but with no `>=`


def test_the_readme_names_the_declared_lower_bounds():
    """The README's table of tested versions follows pyproject.toml."""
    row = next(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| lowest declared"))
    cells = [cell.strip() for cell in row.split("|")]
    assert cells[2:4] == [compat.lowest_declared("torch"), compat.lowest_declared("transformers")]


def test_the_clean_copy_holds_the_package_and_no_build_leftovers(tmp_path):
    copy = compat.clean_copy(tmp_path)
    assert (copy / "pyproject.toml").is_file() and (copy / "scripts" / "tx_part4.py").is_file()
    assert not any((copy / name).exists() for name in (".venv", "_build", ".git"))
    assert not list(copy.rglob("*.egg-info"))


def test_the_origins_cell_refuses_the_repositorys_module():
    """Here tx_part4 comes from the repository (an editable install): the cell compat appends
    to each notebook fails, as it must wherever the book's files are not the installed ones."""
    with pytest.raises(AssertionError, match="tx_part4.py"):
        exec(compat.WHERE, {})


@pytest.mark.parametrize("shape", ["tensor", "dict"])
def test_mamba_layer_bytes_from_either_shape_of_state(shape):
    """transformers 5.5-5.13 keep one tensor per Mamba state, 5.14+ a dict of them: same bytes."""
    conv, state = torch.zeros(1, 64, 4), torch.zeros(1, 64, 16)
    wrap = (lambda t: t) if shape == "tensor" else (lambda t: {0: t})
    mamba = SimpleNamespace(conv_states=wrap(conv), recurrent_states=wrap(state))
    attention = SimpleNamespace(keys=torch.zeros(1, 2, 8, 4), values=torch.zeros(1, 2, 8, 4))
    cache = SimpleNamespace(layers=[mamba, attention])
    assert tx.cache_layer_bytes(cache) == [("mamba", 64 * (4 + 16) * 4), ("attention", 2 * 64 * 4)]


def test_release_names_are_checked_as_versions_off_the_pins(monkeypatch):
    """A page that names the release it ran on differs on another release by design. Every check
    (the build's, the tests' numbers.compare, compat's) treats it one way: the pin on the pins, a
    version string under WHY_SELF_ATTENTION_RELEASES (newest, lowest, colab)."""
    from bookbuild import execute, numbers

    expected = {"p": {"hf_transformers_version": {"kind": "exact", "value": "5.24.0"},
                      "torch_version": {"kind": "exact", "value": "2.13.0+cpu"},
                      "other": {"kind": "exact", "value": 3}}}
    glued = {"p": {"hf_transformers_version": execute.Glued("5.25.0"),
                   "torch_version": execute.Glued("2.15.0+cpu"), "other": execute.Glued(3)}}
    monkeypatch.delenv(numbers.RELEASES, raising=False)
    assert {p.key for p in numbers.compare(expected, glued)} == {"hf_transformers_version", "torch_version"}
    for releases in ("newest", "lowest", "colab"):
        monkeypatch.setenv(numbers.RELEASES, releases)
        assert numbers.compare(expected, glued) == []
    glued["p"]["torch_version"] = execute.Glued("not a version")
    (problem,) = numbers.compare(expected, glued)
    assert problem.key == "torch_version" and "not a version string" in problem.reason
    glued["p"]["other"] = execute.Glued(4)                       # every other number: as always
    assert len(numbers.compare(expected, glued)) == 2
