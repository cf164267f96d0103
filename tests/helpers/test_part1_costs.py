"""Part 1 helpers against independent methods: FlopCounterMode, brute force, a second formula."""

import math
import re

import pytest
import torch

import tx_part4 as tx

SIZES = [(n, d) for n in (1, 2, 5, 17, 33) for d in (1, 3, 8, 64)]


def brute_force_attention(n, d):
    """Count the multiplications of QKᵀ and weights·V one by one, with loops."""
    count = 0
    for _query in range(n):
        for _key in range(n):
            count += d          # score (query, key): a dot product of d numbers
    for _row in range(n):
        for _value in range(n):
            count += d          # output row gets weight (row, value) times that value
    return count


@pytest.mark.parametrize("n,d", SIZES)
def test_attention_core_matches_flop_counter(n, d):
    q, k, v = torch.randn(n, d), torch.randn(n, d), torch.randn(n, d)
    assert 2 * tx.count_self_attention(n, d).core == tx.flops(tx.attention_core, q, k, v)


@pytest.mark.parametrize("n,d", SIZES)
def test_attention_core_matches_brute_force(n, d):
    assert tx.count_self_attention(n, d).core == brute_force_attention(n, d)


@pytest.mark.parametrize("n,d", SIZES)
def test_projections_match_flop_counter(n, d):
    x, W = torch.randn(n, d), torch.randn(d, d)
    assert 2 * tx.count_self_attention(n, d).projections == tx.flops(lambda: [x @ W for _ in range(4)])


@pytest.mark.parametrize("n,d", SIZES)
def test_recurrent_chain_matches_flop_counter(n, d):
    xw, U = torch.randn(n, d), torch.randn(d, d)
    assert 2 * tx.count_recurrent(n, d).chain == tx.flops(tx.recurrent_chain, xw, U)


@pytest.mark.parametrize("n,d,k", [(n, d, k) for n, d in SIZES[::3] for k in (1, 3, 4, 7)])
def test_convolutions_match_flop_counter(n, d, k):
    x = torch.randn(1, d, n)
    conv = torch.nn.Conv1d(d, d, k, padding="same", bias=False)
    depthwise = torch.nn.Conv1d(d, d, k, padding="same", groups=d, bias=False)
    pointwise = torch.nn.Conv1d(d, d, 1, bias=False)
    assert 2 * tx.count_conv(n, d, k) == tx.flops(conv, x)
    assert 2 * tx.count_separable(n, d, k) == tx.flops(lambda: pointwise(depthwise(x)))


def test_measured_counts_all_equal():
    table = tx.measured_counts(n=9, d=16, k=3)
    assert table["equal"].all()
    assert len(table) == 6


@pytest.mark.parametrize("n,d", SIZES)
def test_ratio_is_n_over_d(n, d):
    terms = tx.table1_terms(n, d)
    assert math.isclose(terms["self-attention n²d"] / terms["recurrent nd²"], n / d)


def test_cost_table_rows_and_ratio():
    table = tx.cost_table(ns=(3, 9), d=6, k=5, r=2)
    assert list(table.index) == [3, 9]
    assert table.loc[9, "convolution knd²"] == 5 * 9 * 36
    assert table.loc[9, "restricted rnd"] == 2 * 9 * 6
    assert table.loc[3, "ratio n/d"] == 0.5
    assert table.loc[9, "restricted min(r,n)nd"] == table.loc[9, "restricted rnd"]   # n ≥ r


def test_a_window_wider_than_the_sequence_does_full_attention_work():
    """r > n: Table 1's r·n·d exceeds n²d, but the window holds only the n positions there are."""
    table = tx.cost_table(ns=(3, 10), d=6, k=3, r=16)
    assert table.loc[10, "restricted rnd"] == 16 * 10 * 6 > table.loc[10, "self-attention n²d"]
    for n in (3, 10):
        assert table.loc[n, "restricted min(r,n)nd"] == table.loc[n, "self-attention n²d"]


def test_attention_core_matches_sdpa_and_its_rows_sum_to_one():
    q, k, v = torch.randn(3, 2, 5, 8)
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    for m in (None, mask):
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        assert torch.allclose(tx.attention_core(q, k, v, m), reference, atol=1e-6)


def test_hand_check_is_twice_each_term():
    check = tx.hand_check(7, 5)
    assert check["attention grid 2n²d"] == 2 * 7 * 7 * 5
    assert check["recurrence 2nd²"] == 2 * 7 * 5 * 5


def test_crossing_by_search():
    """Search the first length where pair work reaches weight work; compare with 12·width."""
    for width, heads in ((64, 4), (128, 2), (256, 4)):
        model = tx.ExampleModel(width=width, heads=heads, head_size=width // heads, kv_heads=heads)
        n = 1
        while tx.count_pairs(n, model) < tx.count_weights(n, model):
            n += 1
        assert n == tx.crossing_length(model) == 12 * width


def test_pair_share_second_formula():
    model = tx.ExampleModel()
    for n in (1, 100, 1024, 50_000):
        assert math.isclose(tx.pair_share(n, model), n / (n + 12 * model.width))


def test_example_model_counts_real_modules():
    """Build a small model of the same shape in torch and count its parameters."""
    width, heads, layers, vocab = 32, 4, 3, 100
    model = tx.ExampleModel(layers=layers, width=width, heads=heads, head_size=width // heads,
                            vocabulary=vocab, kv_heads=heads)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width, bias=False) for _ in range(4)]        # Q, K, V, O
        blocks += [torch.nn.Linear(width, 4 * width, bias=False),
                   torch.nn.Linear(4 * width, width, bias=False)]                       # feed-forward
        blocks += [torch.nn.LayerNorm(width, bias=False) for _ in range(2)]              # two norms
    net = torch.nn.ModuleList(blocks + [torch.nn.Embedding(vocab, width),
                                        torch.nn.LayerNorm(width, bias=False)])
    assert model.parameters == sum(p.numel() for p in net.parameters())


def test_sentence_lengths_count_special_tokens():
    tokenizer = tx.load_tokenizer()
    table = tx.sentence_lengths(tokenizer, ["Attention is all you need."], d=512)
    pieces = tokenizer.tokenize("Attention is all you need.")
    assert table.loc[1, "tokens n"] == len(pieces) + 2      # [CLS] and [SEP]
    assert table.loc[1, "words"] == 5


@pytest.mark.parametrize("call,argument", [
    (lambda: tx.count_self_attention(0, 4), "n"),
    (lambda: tx.count_self_attention(4, -1), "d"),
    (lambda: tx.count_recurrent(2.5, 4), "n"),
    (lambda: tx.count_conv(4, 4, 0), "k"),
    (lambda: tx.count_separable(4, 0, 3), "d"),
    (lambda: tx.count_restricted(4, 4, 0), "r"),
    (lambda: tx.table1_terms(4, 4, r=-2), "r"),
    (lambda: tx.hand_check(True, 4), "n"),
    (lambda: tx.count_pairs(0), "n"),
    (lambda: tx.ExampleModel(width=1000), "heads * head_size"),
    (lambda: tx.ExampleModel(kv_heads=3), "kv_heads"),
    (lambda: tx.ExampleModel(layers=0), "layers"),
    (lambda: tx.ExampleAccelerator(memory_bytes=0), "memory_bytes"),
    (lambda: tx.attention_core(torch.ones(2, 3), torch.ones(3, 3), torch.ones(2, 3)), "q, k, v"),
    (lambda: tx.recurrent_chain(torch.ones(2, 3), torch.ones(2, 2)), "xw"),
    (lambda: tx.setup(threads=0), "threads"),
    (lambda: tx.show("bad key", 1), "key"),
    (lambda: tx.show("k", 1, kind="roughly"), "kind"),
    (lambda: tx.plain([1, 2]), "value"),
])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=re.escape(argument)):
        call()
