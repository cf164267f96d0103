"""Part 7 helpers against independent methods: closed forms, FlopCounterMode, brute-force loops,
real tensors and real Hugging Face Mamba and Jamba caches."""

import math

import pytest
import torch
from transformers import DynamicCache

import tx_part4 as tx

RATES = (0.5, 0.9, 0.98, 0.999)


def closed_form_summary(inputs, keep):
    """s_t = Σ_(k ≤ t) keep^(t − k) x_k, summed directly."""
    return [sum(keep ** (t - k) * inputs[k] for k in range(t + 1)) for t in range(len(inputs))]


@pytest.mark.parametrize("keep", RATES)
@pytest.mark.parametrize("n", (1, 5, 40))
def test_running_summary_matches_closed_form(keep, n):
    inputs = [math.sin(3 * t) for t in range(n)]
    for got, want in zip(tx.running_summary(inputs, keep), closed_form_summary(inputs, keep)):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("keep", RATES)
@pytest.mark.parametrize("n", (1, 2, 17, 1000))
def test_weight_of_first_is_keep_to_the_n_minus_one(keep, n):
    assert math.isclose(tx.weight_of_first(keep, n), tx.weight_left(keep, n - 1), rel_tol=1e-9)


def test_content_rates_product():
    kinds = ["word"] * 3 + ["filler"] * 10 + ["word"] * 5
    rates = tx.content_rates(kinds, keep=0.9, hold=0.999)
    assert rates.count(0.999) == 10
    assert math.isclose(tx.weight_of_first(rates, len(rates)), math.prod(rates[1:]), rel_tol=1e-12)


SMALL_MODELS = [tx.ExampleModel(layers=layers, width=width, heads=heads, head_size=width // heads,
                                kv_heads=heads, state_per_channel=state)
                for layers, width, heads, state in ((1, 8, 2, 4), (3, 16, 4, 16), (2, 64, 4, 8))]


@pytest.mark.parametrize("model", SMALL_MODELS)
@pytest.mark.parametrize("n", (1, 7, 64))
def test_decode_attention_flops_match_flop_counter(model, n):
    q = torch.randn(model.heads, 1, model.head_size)
    keys, values = torch.randn(2, model.heads, n, model.head_size)
    per_layer = tx.flops(tx.attention_core, q, keys, values)
    assert tx.decode_attention_flops(n, model) == model.layers * per_layer


@pytest.mark.parametrize("model", SMALL_MODELS)
def test_decode_state_space_flops_match_elementwise_count(model):
    state, a, u, c = torch.randn(4, model.width, model.state_per_channel)
    per_layer = tx.count_elementwise(tx.state_space_step, state, a, u, c)
    assert tx.decode_state_space_flops(model) == model.layers * per_layer


def test_count_elementwise_brute_force():
    x, y, z = torch.randn(3, 5, 7)
    assert tx.count_elementwise(lambda: x * y + z) == 2 * 35
    assert tx.count_elementwise(lambda: (x * y).sum(-1)) == 35 + 35


@pytest.mark.parametrize("model", SMALL_MODELS + [tx.ExampleModel(kv_heads=4)])
@pytest.mark.parametrize("n", (1, 5, 33))
def test_kv_cache_bytes_match_a_real_dynamic_cache(model, n):
    cache = DynamicCache()
    for layer in range(model.layers):
        k, v = torch.randn(2, 1, model.kv_heads, n, model.head_size, dtype=torch.float16)
        cache.update(k, v, layer)
    measured = sum(b for _, b in tx.cache_layer_bytes(cache))
    assert measured == tx.kv_cache_bytes(n, model)


@pytest.mark.parametrize("window", (1, 4, 16))
def test_kv_cache_bytes_window_stops_growing(window):
    model = SMALL_MODELS[1]
    sizes = [tx.kv_cache_bytes(n, model, window) for n in range(1, 40)]
    assert sizes[window - 1:] == [sizes[window - 1]] * (40 - window)
    assert sizes[:window] == [tx.kv_cache_bytes(n, model) for n in range(1, window + 1)]


@pytest.mark.parametrize("model", SMALL_MODELS + [tx.ExampleModel()])
def test_state_memory_matches_real_tensors(model):
    states = [torch.zeros(model.width, model.state_per_channel, dtype=torch.float16)
              for _ in range(model.layers)]
    assert tx.state_memory(model) == sum(s.numel() * s.element_size() for s in states)


@pytest.mark.parametrize("attention_layers", (1, 3, 24))
@pytest.mark.parametrize("n", (1, 1000, 32_768))
def test_hybrid_memory_layer_by_layer(attention_layers, n):
    model = tx.ExampleModel()
    per_layer = [tx.kv_cache_bytes(n, model) // model.layers if i < attention_layers
                 else tx.state_memory(model) // model.layers for i in range(model.layers)]
    assert tx.hybrid_memory(n, model, attention_layers) == sum(per_layer)


def brute_force_scan(a, b):
    """h_t = a_t h_(t-1) + b_t in plain Python numbers, channel by channel."""
    out = []
    for row_a, row_b in zip(a.tolist(), b.tolist()):
        h, row = 0.0, []
        for at, bt in zip(row_a, row_b):
            h = at * h + bt
            row.append(h)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("n,channels", [(1, 1), (5, 3), (64, 4), (300, 2)])
def test_scans_agree_with_brute_force(n, channels):
    a, b = tx.selective_inputs(n, channels, seed=n)
    want = brute_force_scan(a, b)
    for scan in (tx.scan_loop, tx.scan_log_space, tx.scan_associative):
        assert torch.allclose(scan(a, b), want, rtol=1e-9, atol=1e-12), scan.__name__


def test_combine_is_associative_and_joins_two_steps():
    """Joining is associative (the parallel scan relies on it) and equals running the two steps."""
    g = torch.Generator().manual_seed(1)
    steps = [tuple(torch.rand(5, generator=g, dtype=torch.float64) for _ in range(2)) for _ in range(3)]
    left = tx.combine(tx.combine(steps[0], steps[1]), steps[2])
    right = tx.combine(steps[0], tx.combine(steps[1], steps[2]))
    assert all(torch.allclose(x, y, rtol=1e-14) for x, y in zip(left, right))
    h = torch.rand(5, generator=g, dtype=torch.float64)
    (a1, b1), (a2, b2) = steps[:2]
    a, b = tx.combine(steps[0], steps[1])
    assert torch.allclose(a * h + b, a2 * (a1 * h + b1) + b2, rtol=1e-14)


@pytest.mark.parametrize("n", (1, 2, 3, 7, 8, 9, 100))
def test_scan_loop_and_associative_take_any_rate(n):
    """No logarithm and no restriction on the rate: a gain above 1 (Part 4's exploding chain) and
    negative rates scan as well; the associative scan takes ⌈log₂ n⌉ rounds at any n."""
    g = torch.Generator().manual_seed(n)
    a = 2.5 * torch.rand(3, n, generator=g, dtype=torch.float64) - 0.5        # rates in [-0.5, 2)
    b = torch.randn(3, n, generator=g, dtype=torch.float64)
    assert torch.allclose(tx.scan_associative(a, b), brute_force_scan(a, b), rtol=1e-9, atol=1e-9)
    assert torch.allclose(tx.scan_loop(a, b), brute_force_scan(a, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", (1, 2, 5, 64, 1024))
def test_doubling_scan_does_n_log_n_joins_the_loop_n_steps(n):
    """Part 7's scan_ops: the loop does a multiply and an add a step; the doubling scan joins every
    position in each of its ⌈log₂ n⌉ rounds, 2 multiplies and an add a join."""
    a, b = torch.full((1, n), 0.9, dtype=torch.float64), torch.ones(1, n, dtype=torch.float64)
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    assert tx.count_elementwise(tx.scan_loop, a, b) == 2 * n
    assert tx.count_elementwise(tx.scan_associative, a, b) == 3 * n * rounds


def test_scan_log_space_handles_negative_inputs_with_a_complex_log():
    a, b = tx.selective_inputs(200, 3, seed=1)
    assert bool((b < 0).any())
    assert torch.allclose(tx.scan_log_space(a, b), tx.scan_loop(a, b), atol=1e-10)


def test_running_summary_is_scan_loop_on_plain_numbers():
    inputs, rates = [0.3, -1.0, 2.0, 0.5], [0.9, 0.5, 1.0, 0.0]
    want = tx.scan_loop(torch.tensor(rates, dtype=torch.float64), torch.tensor(inputs, dtype=torch.float64))
    assert tx.running_summary(inputs, rates) == want.tolist()


def test_one_attention_formula_for_configs_and_example_models():
    """attention_layer_formula reads a config and calls Part 6's kv_cache_bytes for one layer."""
    from types import SimpleNamespace

    config = SimpleNamespace(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, vocab_size=10)
    model = tx.ExampleModel(layers=1, width=64, heads=8, head_size=8, kv_heads=2, bytes_per_number=4)
    for n in (1, 9, 100):
        assert tx.attention_layer_formula(config, n, batch=3) == 3 * tx.kv_cache_bytes(n, model)
        assert tx.attention_layer_formula(config, n) == 2 * 2 * n * 8 * 4


def test_scans_float32_and_negative_inputs():
    a = torch.full((3, 50), 0.95)
    b = -torch.rand(3, 50) - 0.1
    assert torch.allclose(tx.scan_log_space(a, b), tx.scan_loop(a, b), rtol=1e-4, atol=1e-5)


def test_graph_depth_loop_grows_scans_do_not():
    depths = {}
    for n in (8, 16, 32, 64):
        a, b = (t.requires_grad_() for t in tx.selective_inputs(n, 2))
        depths[n] = [tx.graph_depth(f(a, b))
                     for f in (tx.scan_loop, tx.scan_log_space, tx.scan_associative)]
    loop = [depths[n][0] for n in depths]
    assert [b - a for a, b in zip(loop, loop[1:])] == [2 * 8, 2 * 16, 2 * 32]   # 2 links a step
    assert len({depths[n][1] for n in depths}) == 1                               # constant
    assoc = [depths[n][2] for n in depths]
    steps = {b - a for a, b in zip(assoc, assoc[1:])}
    assert len(steps) == 1 and assoc[-1] < loop[-1] / 2       # one step per doubling: log n


def test_graph_depth_is_iterative_past_the_recursion_limit():
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0
    assert tx.graph_depth(y) == 5001       # 5,000 MulBackward nodes and the leaf's AccumulateGrad


@pytest.mark.parametrize("keep", (0.5, 0.9, 0.99))
def test_naive_scan_overflows_where_predicted(keep):
    length = tx.first_overflow(keep) + 5
    a = torch.full((1, length), keep, dtype=torch.float32)
    b = torch.ones(1, length, dtype=torch.float32)
    finite = torch.isfinite(tx.scan_naive(a, b))[0]
    first_bad = int((~finite).nonzero()[0]) + 1          # positions counted from 1
    assert abs(first_bad - tx.first_overflow(keep)) <= 1
    assert finite[: first_bad - 1].all()
    assert torch.isfinite(tx.scan_log_space(a, b)).all()


@pytest.mark.parametrize("hidden,state", [(16, 4), (32, 16), (48, 8)])
def test_mamba_mixer_weights_equal_a_real_mixer(hidden, state):
    model = tx.tiny_mamba(layers=1, hidden=hidden, state=state)
    real = sum(w.numel() for w in model.backbone.layers[0].mixer.parameters())
    assert tx.mamba_mixer_weights(hidden, expand=2, state=state, conv=4) == real


def test_end_to_end_table_adds_the_projections():
    model = tx.ExampleModel()
    table = tx.end_to_end_table(ns=(1024, 8192), model=model)
    d = model.width
    assert table.loc[8192, "attention layer"] == 8 * d * d + tx.decode_attention_flops(8192, model) // model.layers
    assert table["Mamba mixer"].nunique() == 1                     # the same at every length
    assert table.loc[1024, "layer ratio"] < 1 < table.loc[8192, "layer ratio"]
    swapped = model.parameters + model.layers * (tx.mamba_mixer_weights(d) - 4 * d * d)
    assert table.loc[1024, "attention swapped for mixers"] == 2 * swapped + model.layers * 4 * 2 * d * 16


def test_real_mamba_cache_is_constant_and_matches_formula():
    model = tx.tiny_mamba(layers=2, hidden=16, state=8)
    table = tx.real_cache_table(model, ns=(3, 20, 50))
    assert table["equal"].all()
    assert table["mamba measured"].nunique() == 1
    assert table["mamba measured"].iloc[0] == 2 * (2 * 16) * (4 + 8) * 4


def test_real_jamba_cache_grows_only_in_attention():
    model = tx.tiny_jamba(layers=4, hidden=32, state=8)
    table = tx.real_cache_table(model, ns=(4, 8, 40))
    assert table["equal"].all()
    assert table["mamba measured"].nunique() == 1
    assert list(table["attention measured"]) == [
        2 * 2 * n * 8 * 4 for n in (4, 8, 40)]          # keys and values, 2 kv heads of 8, float32


@pytest.mark.parametrize("model", SMALL_MODELS + [tx.ExampleModel()])
def test_decode_state_space_flops_term_by_term(model):
    """The page's derivation: update 2·d·N, read-out 2·d·N, a layer 4·d·N, the model 4·d·N·L."""
    d, n_state = model.width, model.state_per_channel
    assert tx.decode_state_space_flops(model) == (2 * d * n_state + 2 * d * n_state) * model.layers


@pytest.mark.parametrize("m,n_state,width", [(1, 4, 3), (5, 8, 6), (20, 8, 16)])
def test_state_recall_is_the_outer_product_sum(m, n_state, width):
    """The walk with rate 1 writes S = Σ v kᵀ = Vᵀ K; reading with every key gives K Sᵀ."""
    g = torch.Generator().manual_seed(m)
    keys = torch.randn(m, n_state, generator=g, dtype=torch.float64)
    values = torch.randn(m, width, generator=g, dtype=torch.float64)
    want = keys @ (values.T @ keys).T
    assert torch.allclose(tx.state_recall(keys, values), want, rtol=1e-12, atol=1e-12)


def test_state_recall_exact_for_orthonormal_keys_and_attention_for_distinct_keys():
    g = torch.Generator().manual_seed(3)
    keys = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64)).Q.T[:10]
    values = torch.randn(10, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(tx.state_recall(keys, values), values, atol=1e-12)
    # keys at right angles, long enough that q·k/√d_k puts all the weight on each query's own
    long_one_hot = 40 * torch.eye(4, dtype=torch.float64)
    assert torch.allclose(tx.attention_recall(long_one_hot, values[:4]), values[:4], atol=1e-12)


def test_attention_recall_is_scaled_dot_product_attention():
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(6, 8, generator=g, dtype=torch.float64)
    values = torch.randn(6, 5, generator=g, dtype=torch.float64)
    want = torch.nn.functional.scaled_dot_product_attention(keys, keys, values)
    assert torch.allclose(tx.attention_recall(keys, values), want, atol=1e-12)


def test_no_state_of_n_columns_recalls_more_than_n_values():
    """Every read-out of a (width, N) state lies in its N-dimensional column space."""
    g = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(40, 8, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(40, 32, generator=g, dtype=torch.float64)
    best = keys @ (torch.linalg.pinv(keys) @ values)
    assert int(torch.linalg.matrix_rank(best)) <= 8
    assert int(torch.linalg.matrix_rank(values)) == 32


def test_recall_table_counts():
    table = tx.recall_table(pairs=(2, 8, 32), key_size=8, width=16, seed=1)
    assert list(table["state recalls"][:2]) == [2, 8] == list(table["best state recalls"][:2])
    assert table.loc[32, "best state recalls"] < 32
    # Part 1's scaling with keys of 8 numbers: too soft to return more than one pair within 1 %
    assert table.loc[8, "attention recalls"] < 8
    wide = tx.recall_table(pairs=(16, 64), key_size=128, width=16, seed=1)
    assert list(wide["attention recalls"]) == [16, 64]
    assert list(table["cache numbers"]) == [m * (8 + 16) for m in (2, 8, 32)]
    assert set(table["state numbers"]) == {8 * 16}


def test_memory_table_rows_are_the_formulas():
    model = tx.ExampleModel()
    table = tx.memory_table(4096, model, window=256, attention_layers=2)
    # a window of 256 keeps the 255 tokens the next step reads
    assert list(table["bytes"]) == [tx.kv_cache_bytes(4096, model), tx.kv_cache_bytes(4096, model, 255),
                                    tx.state_memory(model), tx.hybrid_memory(4096, model, 2)]


@pytest.mark.parametrize("call,argument", [
    (lambda: tx.running_summary([1, 2], [0.5]), "keep"),
    (lambda: tx.running_summary([1, 2], 1.5), "keep"),
    (lambda: tx.weight_left(0.9, -1), "steps"),
    (lambda: tx.weight_left(2.0, 3), "keep"),
    (lambda: tx.weight_of_first(0.9, 0), "n"),
    (lambda: tx.content_rates(["filler"], hold=1.2), "hold"),
    (lambda: tx.decode_attention_flops(-1), "n"),
    (lambda: tx.scan_associative(torch.ones(2, 3), torch.ones(3)), "a and b"),
    (lambda: tx.scan_loop([1.0], [1.0]), "a and b"),
    (lambda: tx.kv_cache_bytes(10, kept=0), "kept"),
    (lambda: tx.state_memory(layers=0), "layers"),
    (lambda: tx.hybrid_memory(10, attention_layers=25), "attention_layers"),
    (lambda: tx.hybrid_memory(10, attention_layers=0), "attention_layers"),
    (lambda: tx.scan_loop(torch.ones(2, 3), torch.ones(2, 4)), "a and b"),
    (lambda: tx.scan_log_space(torch.zeros(2, 3), torch.ones(2, 3)), "a must"),
    (lambda: tx.scan_naive(torch.full((1, 2), 1.5), torch.ones(1, 2)), "a must"),
    (lambda: tx.first_overflow(1.0), "keep"),
    (lambda: tx.selective_inputs(0), "n"),
    (lambda: tx.prompt_cache(None, 0), "n"),
    (lambda: tx.attention_layer_formula(None, 0), "n"),
    (lambda: tx.mamba_layer_formula(None, batch=0), "batch"),
    (lambda: tx.recall_table(key_size=0), "key_size"),
    (lambda: tx.recall_table(pairs=(4, 0)), "pairs"),
    (lambda: tx.mamba_mixer_weights(0), "width"),
])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()
