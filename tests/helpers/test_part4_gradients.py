"""Part 4 helpers against independent methods: one backward pass per output number, finite
differences, the power formula, and the exact Jacobian of the real encoder."""

import math

import pytest
import torch

import tx_part4 as tx


def norms_by_backward_loop(fn, x):
    """|d fn(x) / d x_i|, one backward pass for each output number (no vmap)."""
    x = x.detach().requires_grad_(True)
    out = fn(x)
    squares = torch.zeros(x.shape[0], dtype=torch.float64)
    for m in range(out.shape[0]):
        (grad,) = torch.autograd.grad(out[m], x, retain_graph=True)
        squares += grad.double().pow(2).sum(dim=1)
    return squares.sqrt()


@pytest.mark.parametrize("n,d", [(1, 3), (4, 5), (7, 8)])
def test_jacobian_norms_match_a_backward_loop(n, d):
    Wq, Wk, Wv, W, U = tx.random_weights(5, d, seed=n)
    x = torch.randn(n, d)
    for fn in (lambda x: tx.recurrent_layer(x, W, U), lambda x: tx.self_attention_layer(x, Wq, Wk, Wv)[-1]):
        assert torch.allclose(tx.jacobian_norms(fn, x).double(), norms_by_backward_loop(fn, x), rtol=1e-5)


def test_jacobian_norms_match_finite_differences():
    Wq, Wk, Wv = [w.double() for w in tx.random_weights(3, 4, seed=1)]
    fn = lambda x: tx.self_attention_layer(x, Wq, Wk, Wv)[-1]  # noqa: E731
    x = torch.randn(5, 4, dtype=torch.float64)
    eps, squares = 1e-6, torch.zeros(5, dtype=torch.float64)
    for i in range(5):
        for j in range(4):
            step = torch.zeros_like(x)
            step[i, j] = eps
            squares[i] += ((fn(x + step) - fn(x - step)) / (2 * eps)).pow(2).sum()
    assert torch.allclose(tx.jacobian_norms(fn, x), squares.sqrt(), rtol=1e-6)


def test_gradient_by_distance_is_the_mean_of_single_networks():
    n, d, seeds = 6, 4, 3
    table = tx.gradient_by_distance(n, d, seeds)
    rnn, attention = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for seed in range(seeds):
        Wq, Wk, Wv, W, U = tx.random_weights(5, d, seed)
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed))
        rnn += norms_by_backward_loop(lambda x: tx.recurrent_layer(x, W, U), x) / seeds
        attention += norms_by_backward_loop(lambda x: tx.self_attention_layer(x, Wq, Wk, Wv)[-1], x) / seeds
    by_input = table.set_index("input i").sort_index()
    assert torch.allclose(torch.tensor(by_input["RNN"].values), rnn, rtol=1e-5)
    assert torch.allclose(torch.tensor(by_input["self-attention"].values), attention, rtol=1e-5)


def test_gradient_by_distance_is_reproducible():
    torch.set_num_threads(1)
    first, second = tx.gradient_by_distance(12, 8, 4), tx.gradient_by_distance(12, 8, 4)
    assert first.equals(second)


def test_log10_slope_recovers_a_known_decay():
    xs = [0, 3, 7, 12]
    assert math.isclose(tx.log10_slope(xs, [5 * 10 ** (-0.25 * x) for x in xs]), -0.25, rel_tol=1e-9)
    with pytest.raises(ValueError, match="x and y"):
        tx.log10_slope([1], [1])


def test_orders_of_magnitude():
    assert math.isclose(tx.orders_of_magnitude([1e-9, 1.0, 10.0]), 10.0)
    assert tx.orders_of_magnitude([3.0]) == 0.0


@pytest.mark.parametrize("keep,steps", [(0.98, 100), (0.98, 511), (0.9, 17), (1.0, 40), (0.5, 1)])
def test_weight_left_matches_autograd_and_logarithms(keep, steps):
    assert math.isclose(tx.weight_left(keep, steps), tx.chain_gradient(keep, steps), rel_tol=1e-12)
    assert math.isclose(tx.weight_left(keep, steps), math.exp(steps * math.log(keep)), rel_tol=1e-12)


def test_survival_table_agrees():
    table = tx.survival_table(steps=(1, 50, 511))
    assert (table["relative difference"] < 1e-12).all()


def test_encoder_probe_estimate_matches_the_exact_jacobian():
    tokenizer, model = tx.load_tokenizer(), tx.load_encoder()
    text = "Keys are lost."
    estimate = tx.encoder_gradients(model, tokenizer, text, probes=64)
    encoded = tokenizer(text, return_tensors="pt")
    x = model.get_input_embeddings()(encoded["input_ids"]).detach().requires_grad_(True)
    out = model(inputs_embeds=x, attention_mask=encoded["attention_mask"]).last_hidden_state[0]
    last = encoded["input_ids"].shape[1] - 2
    every_output = torch.eye(out.shape[1])            # one backward pass per output number, batched
    (jacobian,) = torch.autograd.grad(out[last], x, every_output, is_grads_batched=True)
    exact = jacobian[:, 0].double().pow(2).sum(dim=(0, 2)).sqrt()
    assert torch.allclose(torch.tensor(estimate["gradient"].values), exact, rtol=0.2)
    assert estimate["distance"].tolist() == [last - i for i in range(x.shape[1])]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="x must"):
        tx.jacobian_norms(lambda x: x.sum(0), torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="seeds"):
        tx.gradient_by_distance(seeds=0)
    with pytest.raises(ValueError, match="values"):
        tx.orders_of_magnitude([1.0, 0.0])
    with pytest.raises(ValueError, match="keep"):
        tx.weight_left(1.5, 5)
    with pytest.raises(ValueError, match="steps"):
        tx.weight_left(0.5, -1)
    with pytest.raises(ValueError, match="keep"):
        tx.chain_gradient(0.0, 5)
    with pytest.raises(ValueError, match="keep"):
        tx.chain_gradient(1.5, 5)
    with pytest.raises(ValueError, match="steps"):
        tx.chain_gradient(0.5, 0)
    with pytest.raises(ValueError, match="probes"):
        tx.encoder_gradients(None, None, "x", probes=0)


def test_survival_is_gone_weight_left_is_the_one_name():
    assert not hasattr(tx, "survival")


@pytest.mark.parametrize("gain", [0.9, 0.98, 1 / 0.98, 1.1])
def test_linear_chain_gradient_is_the_gain_to_the_power(gain):
    width, steps = 5, 30
    g = torch.Generator().manual_seed(1)
    Q = torch.linalg.qr(torch.randn(width, width, dtype=torch.float64, generator=g))[0]
    x = torch.randn(steps + 1, width, dtype=torch.float64, generator=g)
    norms = tx.jacobian_norms(lambda x: tx.linear_chain(x, gain * Q), x).flip(0)   # row k: k steps back
    expected = torch.tensor([gain ** k * math.sqrt(width) for k in range(steps + 1)], dtype=torch.float64)
    assert torch.allclose(norms, expected, rtol=1e-10)


def test_lstm_by_distance_is_the_mean_of_single_lstms():
    n, d, seeds = 6, 4, 2
    table = tx.lstm_by_distance(n, d, seeds, forget_biases=(None, 3.0))
    for bias, column in ((None, "PyTorch default"), (3.0, "forget bias 3")):
        mean = torch.zeros(n, dtype=torch.float64)
        for seed in range(seeds):
            torch.manual_seed(seed)
            lstm = torch.nn.LSTM(d, d)
            if bias is not None:
                with torch.no_grad():
                    lstm.bias_ih_l0[d:2 * d] = bias
                    lstm.bias_hh_l0[d:2 * d] = 0.0
            x = torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed))
            mean += norms_by_backward_loop(lambda x: lstm(x)[0][-1], x) / seeds
        assert torch.allclose(torch.tensor(table[column].values[::-1].copy()), mean, rtol=1e-5)


def test_a_forget_bias_near_one_keeps_the_gradient_and_the_default_does_not():
    table = tx.lstm_by_distance(n=30, d=16, seeds=2, forget_biases=(None, 3.0))
    assert table.loc[29, "forget bias 3"] > 0.1 * table.loc[0, "forget bias 3"]
    assert table.loc[29, "PyTorch default"] < 1e-4 * table.loc[0, "PyTorch default"]
    with pytest.raises(ValueError, match="seeds"):
        tx.lstm_by_distance(seeds=0)


@pytest.mark.parametrize("bias", [None, 3.0])
def test_lstm_steps_is_nn_lstm(bias):
    lstm = tx.seeded_lstm(6, seed=2, forget_bias=bias).double()
    x = torch.randn(9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    h, forget = tx.lstm_steps(lstm, x)
    assert torch.allclose(h, lstm(x)[0][-1], rtol=1e-12, atol=1e-12)
    first = torch.sigmoid(x[0] @ lstm.weight_ih_l0[6:12].T + lstm.bias_ih_l0[6:12] + lstm.bias_hh_l0[6:12])
    assert forget.shape == (9, 6) and torch.allclose(forget[0], first)   # h_0 = 0: the gate of x_1 alone
    h_cut, forget_cut = tx.lstm_steps(lstm, x, cell_path_only=True)
    assert torch.equal(h_cut, h) and torch.equal(forget_cut, forget)      # detaching changes no value


def test_seeded_lstm_sets_one_forget_bias_and_keeps_the_rest():
    default, biased = tx.seeded_lstm(4, seed=5), tx.seeded_lstm(4, seed=5, forget_bias=2.5)
    assert torch.equal(biased.bias_ih_l0[4:8], torch.full((4,), 2.5))
    assert torch.equal(biased.bias_hh_l0[4:8], torch.zeros(4))
    for name in ("weight_ih_l0", "weight_hh_l0"):
        assert torch.equal(getattr(default, name), getattr(biased, name))
    keep = torch.ones(16, dtype=torch.bool)
    keep[4:8] = False                                                    # every slice but the forget gate's
    assert torch.equal(default.bias_ih_l0[keep], biased.bias_ih_l0[keep])
    assert bool((default.bias_ih_l0.abs() <= 0.5).all())                # uniform in ±1/√4


def test_cell_path_only_is_the_product_of_forget_gates():
    """With h_(t-1) cut, d h_n / d x_i = diag(o_n tanh'(c_n)) · Π_(t>i) diag(f_t) · d c_i / d x_i."""
    n, d = 7, 3
    lstm = tx.seeded_lstm(d, seed=1, forget_bias=1.0).double()
    x = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    W, b = lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0
    h, c, gates, cells = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64), [], []
    with torch.no_grad():
        for x_t in x:                                    # the forward pass, by hand
            z = x_t @ W.T + h @ lstm.weight_hh_l0.T + b
            i, f, g, o = z[:d].sigmoid(), z[d:2 * d].sigmoid(), z[2 * d:3 * d].tanh(), z[3 * d:].sigmoid()
            gates.append((i, f, g, o, c))                # c here is c_(t-1)
            c = f * c + i * g
            h = o * c.tanh()
            cells.append(c)
    expected = torch.zeros(n, dtype=torch.float64)
    for k in range(n - 1):                               # every input but the last (its o_n path is cut too)
        i, f, g, o, c_before = gates[k]
        dc_dx = ((c_before * f * (1 - f))[:, None] * W[d:2 * d] + (g * i * (1 - i))[:, None] * W[:d]
                 + (i * (1 - g ** 2))[:, None] * W[2 * d:3 * d])
        carry = torch.stack([gates[t][1] for t in range(k + 1, n)]).prod(dim=0)
        o_n = gates[-1][3]
        expected[k] = ((o_n * (1 - cells[-1].tanh() ** 2) * carry)[:, None] * dc_dx).pow(2).sum().sqrt()
    found = tx.jacobian_norms(lambda x: tx.lstm_steps(lstm, x, cell_path_only=True)[0], x)
    assert torch.allclose(found[:-1], expected[:-1], rtol=1e-10)


def test_lstm_by_distance_cell_path_and_forget_gates():
    table = tx.lstm_by_distance(n=8, d=4, seeds=2, forget_biases=(3.0,), cell_path_only=True)
    assert list(table.columns) == ["forget bias 3, cell path only"]
    mean = torch.zeros(8, dtype=torch.float64)
    for seed in range(2):
        lstm, x = tx.seeded_lstm(4, seed, 3.0), tx.lstm_inputs(8, 4, seed)
        mean += norms_by_backward_loop(lambda x: tx.lstm_steps(lstm, x, cell_path_only=True)[0], x) / 2
    assert torch.allclose(torch.tensor(table.iloc[:, 0].values[::-1].copy()), mean, rtol=1e-5)
    gates = tx.lstm_forget_gates(n=8, d=4, seeds=2, forget_biases=(None, 50.0))
    assert 0.3 < gates["PyTorch default"] < 0.7 and gates["forget bias 50"] > 0.999999
    with pytest.raises(ValueError, match="seeds"):
        tx.lstm_forget_gates(seeds=0)


def test_rnn_at_torch_init_is_nn_rnn_measured_by_backward_passes():
    """The tanh RNN at the LSTM's scale: the fused torch.nn.RNN, one backward pass per output."""
    n, d, seeds = 7, 5, 2
    column = tx.rnn_at_torch_init(n, d, seeds)
    mean = torch.zeros(n, dtype=torch.float64)
    for seed in range(seeds):
        torch.manual_seed(seed)
        rnn = torch.nn.RNN(d, d, bias=False, nonlinearity="tanh")
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(10_000 + seed))
        W, U = rnn.weight_ih_l0.detach().T, rnn.weight_hh_l0.detach().T
        assert torch.allclose(tx.recurrent_layer(x, W, U), rnn(x)[0][-1], atol=1e-6)
        mean += norms_by_backward_loop(lambda x: rnn(x)[0][-1], x) / seeds
    assert torch.allclose(torch.tensor(column.values[::-1].copy()), mean, rtol=1e-5)
    with pytest.raises(ValueError, match="seeds"):
        tx.rnn_at_torch_init(seeds=0)


def test_lstm_column_names():
    assert tx.lstm_column(None) == "PyTorch default"
    assert tx.lstm_column(1.0) == "forget bias 1"
    assert tx.lstm_column(3.0, cell_path_only=True) == "forget bias 3, cell path only"


def test_part4_tables_reach_the_command_line():
    titles = [title for title, _ in tx.TABLES if title.startswith("Part 4")]
    assert len(titles) == 2 and any("survival" in title or "0.98" in title for title in titles)
