"""Part 3 helpers against independent methods: loops, full boolean products, breadth-first
search, closed formulas, real Conv1d gradients, and the encoder's attention recomputed by hand."""

import math

import pytest
import torch

import tx_part4 as tx


def links_by_loops(n, offsets):
    """The companion article's construction: two loops over outputs and offsets."""
    links = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for o in offsets:
            if 0 <= i + o < n:
                links[i, i + o] = True
    return links


def layers_by_full_product(n, layer_offsets, max_layers):
    """The companion article's method: multiply the whole (n, n) reach table, layer after layer."""
    reach = torch.eye(n, dtype=torch.bool)
    for L in range(1, max_layers + 1):
        reach = (links_by_loops(n, layer_offsets(L)).int() @ reach.int()) > 0
        if reach[n - 1, 0]:
            return L
    return None


def layers_by_search(n, layer_offsets, max_layers):
    """Breadth-first search over (layer, position): the fewest layers from input 1 to output n."""
    frontier = {0}
    for L in range(1, max_layers + 1):
        links = links_by_loops(n, layer_offsets(L))
        frontier = {i for i in range(n) if any(links[i, j] for j in frontier)}
        if n - 1 in frontier:
            return L
    return None


OFFSETS = [[0, -1, -2], [0, -1], [-2, -1, 0, 1, 2], [0, -3, -6], [-1]]


@pytest.mark.parametrize("n", [1, 2, 7, 20])
@pytest.mark.parametrize("offsets", OFFSETS)
def test_window_links_match_loops(n, offsets):
    assert torch.equal(tx.window_links(n, offsets), links_by_loops(n, offsets))


@pytest.mark.parametrize("n", [2, 5, 8, 13, 27, 30])
def test_layers_to_connect_matches_full_product_and_search(n):
    stacks = [lambda L: tx.every_offset(n),
              lambda L: tx.contiguous_offsets(3),
              lambda L: tx.dilated_offsets(L, 3),
              lambda L: tx.centred_offsets(5),
              lambda L: [-1],
              lambda L: [0, -(L % 4) - 1]]
    for layer_offsets in stacks:
        fast = tx.layers_to_connect(n, layer_offsets, max_layers=3 * n)
        assert fast == layers_by_full_product(n, layer_offsets, 3 * n) == layers_by_search(n, layer_offsets, 3 * n)


@pytest.mark.parametrize("n", [1, 2, 9, 30])
@pytest.mark.parametrize("offsets", OFFSETS + [[3, -40, 40, 0]])
def test_follow_is_the_boolean_product_of_the_link_table(n, offsets):
    g = torch.Generator().manual_seed(n)
    for seen in (torch.rand(n, generator=g) < 0.3, torch.rand(n, generator=g) < 0.7):
        assert torch.equal(tx.follow(seen, offsets), (links_by_loops(n, offsets).int() @ seen.int()) > 0)


def test_layers_to_connect_gives_none_when_never_connected():
    n = 6
    assert tx.layers_to_connect(n, lambda L: [0, 1], max_layers=20) is None


@pytest.mark.parametrize("n", [2, 3, 8, 27, 64, 100])
def test_path_table_against_closed_formulas(n):
    row = tx.path_table(ns=(n,), k=3, rs=(5, 17)).loc[n]
    assert row["self-attention"] == 1
    assert row["recurrent"] == n - 1
    assert row["conv k=3"] == math.ceil((n - 1) / 2)            # 2 positions further per layer
    assert row["dilated k=3"] == max(1, math.ceil(round(math.log(n, 3), 9)))
    assert row["restricted r=5"] == math.ceil((n - 1) / 2)      # ⌊r/2⌋ = 2 per layer
    assert row["restricted r=17"] == math.ceil((n - 1) / 8)     # ⌊r/2⌋ = 8 per layer


@pytest.mark.parametrize("n", [2, 5, 30, 100])
def test_recurrent_path_is_a_chain_of_shifts(n):
    assert tx.recurrent_path(n) == tx.layers_to_connect(n, lambda L: [-1])


def test_conv_layers_table_agrees_with_formulas():
    table = tx.conv_layers_table(ns=(4, 10, 27, 50), k=3)
    assert table["equal"].all()


@pytest.mark.parametrize("k,distance", [(3, 512), (7, 512), (5, 40), (3, 7)])
def test_contiguous_layers_match_link_tables(k, distance):
    assert tx.contiguous_layers(distance, k) == tx.layers_to_connect(distance + 1, lambda L: tx.contiguous_offsets(k))


@pytest.mark.parametrize("n,dilated", [(9, False), (27, False), (27, True), (40, True)])
def test_conv_stack_gradient_is_zero_exactly_until_connected(n, dilated):
    need = tx.dilated_layers(n) if dilated else tx.contiguous_layers(n - 1)
    assert tx.conv_stack_gradient(n, need - 1, dilated) == 0.0
    assert tx.conv_stack_gradient(n, need, dilated) > 0.0


def test_conv_stack_table_rows_are_roles():
    for n in (11, 27):
        table = tx.conv_stack_table(n=n)
        assert table.index.tolist() == ["contiguous short", "contiguous enough", "dilated short", "dilated enough"]
        assert table["connected"].tolist() == [False, True, False, True]
        assert table.loc["contiguous enough", "layers"] == tx.contiguous_layers(n - 1)


def conv_stack_support(dilations, k=3, channels=2):
    """How many inputs the last output of a real Conv1d stack depends on (non-zero gradient)."""
    n = 1 + (k - 1) * sum(dilations) + 5
    x = torch.randn(1, channels, n, dtype=torch.float64, requires_grad=True)
    h = x
    for dilation in dilations:
        w = torch.rand(channels, channels, k, dtype=torch.float64) + 0.1   # positive: no cancellation
        h = torch.tanh(torch.nn.functional.conv1d(torch.nn.functional.pad(h, ((k - 1) * dilation, 0)),
                                                  w, dilation=dilation))
    (grad,) = torch.autograd.grad(h[0, :, -1].sum(), x)
    return int((grad[0].abs().sum(0) > 0).sum())


@pytest.mark.parametrize("dilations", [[1], [1, 1, 1], [1, 2, 4, 8], [1, 3, 9]])
def test_reach_after_matches_formula_and_real_convolutions(dilations):
    reach = tx.reach_after(dilations)
    assert len(reach) == len(dilations)
    assert reach[-1] == 1 + 2 * sum(dilations) == conv_stack_support(dilations)
    assert reach == [conv_stack_support(dilations[:L]) for L in range(1, len(dilations) + 1)]


def test_reach_after_sees_gaps_that_the_formula_misses():
    dilations = [2, 5]                              # taps 0, 2, 4 then 0, 5, 10: gaps remain
    assert tx.reach_after(dilations)[-1] == conv_stack_support(dilations) < 1 + 2 * sum(dilations)


def test_reach_and_layers_to_cover():
    assert [tx.reach(L) for L in range(1, 13)] == tx.reach_after([1] * 12)
    assert [tx.reach(L, doubling=True) for L in range(1, 13)] == tx.reach_after([2 ** i for i in range(12)])
    for context, doubling in [(8192, True), (100, False), (33, True)]:
        layers = tx.layers_to_cover(context, doubling=doubling)
        assert tx.reach(layers, doubling=doubling) >= context
        assert layers == 1 or tx.reach(layers - 1, doubling=doubling) < context


def test_capped_doubling_grows_linearly_beyond_one_block():
    """ByteNet's schedule (1, 2, 4, 8, 16, then again from 1), followed with layers_to_connect,
    against the fewest layers whose summed dilations reach back n - 1 positions (k = 3)."""
    def capped(L):
        return [-tap * 2 ** ((L - 1) % 5) for tap in range(3)]

    def by_sum(n):
        layers, back = 0, 0
        while back < n - 1:
            back += 2 * 2 ** (layers % 5)               # a kernel of 3 reaches 2 dilations further
            layers += 1
        return layers

    counts = {n: tx.layers_to_connect(n, capped) for n in (2, 3, 62, 63, 64, 125, 126, 512)}
    assert counts == {n: by_sum(n) for n in counts}
    assert counts[63] == 5 and counts[64] == 6 and counts[125] == 10 and counts[126] == 11
    assert counts[512] > tx.layers_to_cover(512, doubling=True)


def test_cone_of_a_centred_kernel():
    n, middle = 17, 8
    links = tx.window_links(n, tx.centred_offsets(3))
    seen = torch.zeros(n, dtype=torch.bool)
    seen[middle] = True
    sizes, cone = [1], [seen]
    while not seen.all():
        seen = (links.float() @ seen.float()) > 0
        sizes.append(int(seen.sum()))
        assert torch.equal(seen, tx.follow(cone[-1], tx.centred_offsets(3)))
        cone.append(seen)
    assert sizes == list(range(1, n + 1, 2))


def test_fixed_weights():
    w = tx.fixed_weights(10, 4, k=3)
    assert math.isclose(w.sum().item(), 1.0)
    assert torch.nonzero(w).flatten().tolist() == [3, 4, 5]


def test_order_test():
    assert tx.order_test(n=6, d=8) < 1e-5
    assert tx.order_test(n=6, d=8, positions=True) > 1e-2
    assert tx.order_test(n=6, d=8, causal=True) > 1e-2          # a causal mask alone sees order


def test_order_test_matches_the_layer_of_part_2():
    """Without a mask, the test's layer is Part 2's self_attention_layer, so the seeded value holds."""
    Wq, Wk, Wv = tx.random_weights(3, 16, 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=g)
    perm = torch.randperm(8, generator=g)
    add = tx.sinusoid_positions(8, 16)
    expected = (tx.self_attention_layer(x[perm] + add, Wq, Wk, Wv)
                - tx.self_attention_layer(x + add, Wq, Wk, Wv)[perm]).abs().max().item()
    assert tx.order_test(n=8, d=16, seed=0, positions=True) == expected


def test_sinusoid_positions_against_the_formula():
    table = tx.sinusoid_positions(5, 6)
    pos, i = 3, 2
    assert math.isclose(table[pos, 2 * i].item(), math.sin(pos / 10000 ** (2 * i / 6)), rel_tol=1e-6)
    assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(pos / 10000 ** (2 * i / 6)), rel_tol=1e-6)


def test_attention_maps_are_the_model_s_own_weights():
    """Recompute layer 1's attention by hand from the encoder's query and key weights."""
    tokenizer, model = tx.load_tokenizer(), tx.load_encoder()
    tokens, maps = tx.attention_maps(model, tokenizer, "The keys that the man left are lost.")
    assert maps.shape[0] == model.config.num_hidden_layers and maps.shape[-1] == len(tokens)
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)
    encoded = tokenizer("The keys that the man left are lost.", return_tensors="pt")
    with torch.no_grad():
        hidden = model.embeddings(input_ids=encoded["input_ids"])[0]
        layer = model.encoder.layer[0].attention.self
        heads, size = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
        q = layer.query(hidden).view(-1, heads, size).transpose(0, 1)
        k = layer.key(hidden).view(-1, heads, size).transpose(0, 1)
        by_hand = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(size), dim=-1)
    assert torch.allclose(by_hand, maps[0], atol=1e-5)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="n must"):
        tx.window_links(0, [0])
    with pytest.raises(ValueError, match="offsets"):
        tx.window_links(4, [])
    with pytest.raises(ValueError, match="max_layers"):
        tx.layers_to_connect(4, lambda L: [0, -1], max_layers=0)
    with pytest.raises(ValueError, match="layers"):
        tx.reach(0)
    with pytest.raises(ValueError, match="n must"):
        tx.recurrent_path(0)
    with pytest.raises(ValueError, match="r must"):
        tx.centred_offsets(4)
    with pytest.raises(ValueError, match="k must"):
        tx.contiguous_layers(10, 1)
    with pytest.raises(ValueError, match="layers"):
        tx.conv_stack_gradient(10, 0)
    with pytest.raises(ValueError, match="dilation"):
        tx.reach_after([1, 0])
    with pytest.raises(ValueError, match="position"):
        tx.fixed_weights(5, 5)
    with pytest.raises(ValueError, match="d must"):
        tx.sinusoid_positions(4, 5)


@pytest.mark.parametrize("n,kind", [(8, "dilated"), (8, "chain"), (27, "conv"), (5, "all")])
def test_shortest_route_follows_links_and_is_shortest(n, kind):
    stacks = {"dilated": lambda L: tx.dilated_offsets(L),
              "chain": lambda L: [-1],
              "conv": lambda L: tx.contiguous_offsets(3),
              "all": lambda L: tx.every_offset(n)}
    offsets = stacks[kind]
    layers = layers_by_search(n, offsets, 3 * n)
    route = tx.shortest_route(n, offsets, layers)
    assert route[0] == 0 and route[-1] == n - 1 and len(route) == layers + 1
    for level in range(1, layers + 1):               # every hop is a link of its layer
        assert links_by_loops(n, offsets(level))[route[level], route[level - 1]]
    if layers > 1:
        with pytest.raises(ValueError, match="layers must"):
            tx.shortest_route(n, offsets, layers - 1)


def test_part3_tables_reach_the_command_line():
    makers = {make.__name__ for title, make in tx.TABLES if title.startswith("Part 3")}
    assert makers == {"path_table", "conv_layers_table", "conv_stack_table"}
