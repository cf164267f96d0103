"""Part 5 helpers against independent methods: loops, the library's SDPA, FlopCounterMode, real masks."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import tx_part4 as tx

CASES = [(n, d, r) for n in (1, 2, 7, 10, 33) for d in (1, 4, 16) for r in (1, 3, 5, 9)]


def loop_window_mask(n, r):
    """The window mask built one pair at a time."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = abs(i - j) <= r // 2
    return mask


def loop_attention(q, k, v, r):
    """Restricted attention one query at a time: softmax over the keys of its window only."""
    n, d = q.shape
    rows = []
    for i in range(n):
        keys = [j for j in range(n) if abs(i - j) <= r // 2]
        scores = torch.stack([q[i] @ k[j] for j in keys]) / math.sqrt(d)
        rows.append(torch.softmax(scores, dim=0) @ v[keys])
    return torch.stack(rows)


@pytest.mark.parametrize("n,r", [(n, r) for n in (1, 4, 10, 17) for r in (1, 3, 5, 21)])
def test_window_mask_matches_loops(n, r):
    assert torch.equal(tx.window_mask(n, r), loop_window_mask(n, r))


def test_window_mask_of_the_book():
    assert int(tx.window_mask(10, 5).sum()) == 44


@pytest.mark.parametrize("n,r", [(1, 1), (3, 5), (10, 5), (12, 7)])
def test_band_slots_hold_the_mask(n, r):
    """Scattering the band's slots back into an n × n grid gives the window mask."""
    slots = tx.band_slots(n, r)
    grid = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for key in slots[i].tolist():
            if key >= 0:
                grid[i, key] = True
    assert torch.equal(grid, tx.window_mask(n, r))
    assert slots.shape == (n, r)


@pytest.mark.parametrize("n,d,r", CASES)
def test_three_implementations_agree(n, d, r):
    g = torch.Generator().manual_seed(n * 100 + d * 10 + r)
    q, k, v = (torch.randn(n, d, generator=g) for _ in range(3))
    mask = tx.window_mask(n, r)
    masked = tx.attention_core(q, k, v, mask)
    library = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    banded = tx.banded_attention(q, k, v, r)
    blocked = tx.blocked_attention(q, k, v, r)
    reference = loop_attention(q, k, v, r)
    assert torch.allclose(masked, library, atol=1e-6)
    assert torch.allclose(banded, masked, atol=1e-6)
    assert torch.allclose(banded, reference, atol=1e-6)
    assert torch.allclose(blocked, reference, atol=1e-6)


@pytest.mark.parametrize("n,d,r", [(n, d, r) for n, d, r in CASES if n > 1])
def test_flop_counts_match_flop_counter(n, d, r):
    q, k, v = torch.randn(n, d), torch.randn(n, d), torch.randn(n, d)
    assert tx.masked_flops(n, d) == tx.flops(tx.attention_core, q, k, v, tx.window_mask(n, r))
    assert tx.banded_flops(n, d, r) == tx.flops(tx.banded_attention, q, k, v, r)
    assert tx.blocked_flops(n, d, r) == tx.flops(tx.blocked_attention, q, k, v, r)


@pytest.mark.parametrize("n,r", [(34, 17), (35, 17), (4096, 17), (1000, 5)])
def test_blocked_flops_are_about_twice_the_band(n, r):
    blocks = math.ceil(n / r)
    assert tx.blocked_flops(n, 64, r) == 4 * blocks * r * (2 * r - 1) * 64
    ratio = tx.blocked_flops(n, 64, r) / tx.banded_flops(n, 64, r)
    assert math.isclose(ratio, blocks * r * (2 * r - 1) / (n * r))   # 2 - 1/r when r divides n
    assert n % r or ratio < 2


def test_flop_table_on_meta_equals_real_tensors():
    meta = tx.flop_table(ns=(16, 40), d=8, r=5, device="meta")
    real = tx.flop_table(ns=(16, 40), d=8, r=5, device="cpu")
    assert meta.equals(real)
    assert meta["equal"].all()


def test_time_table_has_positive_times():
    table = tx.time_table(ns=(32,), d=8, r=5, min_time=0)
    assert (table[["masked ms", "banded ms", "blocked ms"]] > 0).all().all()
    assert table.loc[32, "blocked FLOP ratio"] == tx.masked_flops(32, 8) / tx.blocked_flops(32, 8, 5)
    row = table.loc[32]
    assert math.isclose(row["saving kept"], row["time ratio"] / row["FLOP ratio"])
    assert math.isclose(row["blocked saving kept"], row["blocked time ratio"] / row["blocked FLOP ratio"])
    assert math.isclose(row["masked GFLOP/s"], tx.masked_flops(32, 8) / (row["masked ms"] / 1e3) / 1e9)
    assert math.isclose(row["banded GFLOP/s"], tx.banded_flops(32, 8, 5) / (row["banded ms"] / 1e3) / 1e9)
    assert 3 <= row["fewest runs"] <= row["most runs"] <= 15        # time_call's default bounds
    fewer = tx.time_table(ns=(32,), d=8, r=5, min_time=0, min_runs=2).loc[32]
    assert fewer["fewest runs"] == fewer["most runs"] == 2           # min_runs reaches time_call


def test_causal_time_table_columns():
    table = tx.causal_time_table(ns=(16, 40), d=8, min_time=0)
    assert list(table.index) == [16, 40]
    assert (table[["no mask ms", "is_causal ms", "boolean mask ms"]] > 0).all().all()
    row = table.loc[40]
    assert math.isclose(row["no mask ÷ is_causal"], row["no mask ms"] / row["is_causal ms"])


def test_aten_ops_names_the_kernel():
    """A 4-D SDPA call on CPU is one fused operation; plain matrix products are listed as mm."""
    q = torch.randn(1, 1, 8, 4)
    assert len(tx.aten_ops(F.scaled_dot_product_attention, q, q, q, is_causal=True)) == 1
    a = torch.randn(3, 3)
    assert tx.aten_ops(lambda x: x @ x @ x, a) == ["mm", "mm"]


def test_score_table_bytes_and_cache():
    assert tx.score_table_bytes(4096) == {"scores": 64 * 2**20, "mask": 16 * 2**20}
    cache = tx.largest_cache_bytes()
    assert cache is None or (isinstance(cache, int) and cache > 0)


def test_time_table_products_share_is_the_two_products_over_the_whole():
    table = tx.time_table(ns=(32,), d=8, r=5, min_time=0)
    row = table.loc[32]
    assert row["products ms"] > 0 and math.isclose(row["products share"],
                                                  row["products ms"] / row["masked ms"])


def test_time_table_share_kept_is_the_ratio_of_rates():
    """The page reads the share of the FLOP saving kept as time as the faster version's rate over
    the mask's rate: the same number, whatever the clock says."""
    table = tx.time_table(ns=(32,), d=8, r=5, min_time=0)
    row = table.loc[32]
    for name, pre in (("banded", ""), ("blocked", "blocked ")):
        rate_ratio = row[f"{name} GFLOP/s"] / row["masked GFLOP/s"]
        assert math.isclose(row[f"{pre}saving kept"], rate_ratio, rel_tol=1e-9)


# ── Part 5 alone, on simulated machines (issue 17): the number check and the cache sentence ──

PAGE = "05_restricted_attention"
CACHE_PHRASE = f"score_table_vs_cache_{4096}"
MACHINES = {  # what WHY_SELF_ATTENTION_MACHINE tells the page: another cache, other cores
    "300 MiB cache, 1 core": {"largest_cache_bytes": 300 * 2**20, "cores": 1},
    "2 MiB cache, 64 cores": {"largest_cache_bytes": 2 * 2**20, "cores": 64},
}


def run_page_on(run_alone, facts: dict):
    """Execute Part 5's .ipynb alone in an empty folder, as the build does, with
    the machine facts replaced; return the executed notebook."""
    import json

    from bookbuild import common

    source = common.ROOT / "notebooks" / f"{PAGE}.ipynb"
    return run_alone(source, {tx.MACHINE_ENV: json.dumps(facts)})


@pytest.fixture(scope="module")
def simulated_runs(run_alone):
    """Part 5 executed once for each simulated machine, one at a time (the facts go to the
    kernel's environment, not this process's)."""
    return {name: run_page_on(run_alone, facts) for name, facts in MACHINES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MACHINES))
def test_page_alone_on_another_machine_passes_the_number_check(simulated_runs, name):
    from bookbuild import execute, numbers

    glued = execute.glued_in_notebook(simulated_runs[name])
    expected = numbers.load_expected()
    problems = numbers.compare({PAGE: expected[PAGE]}, {PAGE: glued})
    assert not problems, f"Part 5 on a machine with {name}:\n" + numbers.problem_table(problems)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MACHINES))
def test_page_alone_on_another_machine_states_its_cache(simulated_runs, name):
    from bookbuild import execute

    facts = MACHINES[name]
    glued = execute.glued_in_notebook(simulated_runs[name])
    table = (glued[f"score_table_mib_{4096}"].value + glued[f"mask_mib_{4096}"].value) * 2**20
    want = ("more than this CPU's largest cache holds" if table > facts["largest_cache_bytes"]
            else "less than this CPU's largest cache holds")
    assert want in glued[CACHE_PHRASE].value
    if table <= facts["largest_cache_bytes"]:    # fits: the page leaves residency open
        assert "this page does not settle" in glued[CACHE_PHRASE].value
    printed = "".join(output.get("text", "") for cell in simulated_runs[name].cells
                      if cell.cell_type == "code" for output in cell.get("outputs", []))
    size = f"largest cache {facts['largest_cache_bytes'] / 2**20:,.0f} MiB"
    assert size in printed and f"{facts['cores']} cores" in printed, \
        "the setup line must print the simulated machine's facts"


def test_trade_table_product_tends_to_two():
    """Work × layers ÷ n²d: r·⌈(n − 1)/⌊r/2⌋⌉ / n, which falls towards 2 as r grows."""
    n, d = 8192, 512
    table = tx.trade_table(n=n, d=d, rs=(3, 17, 1025, 4097))
    for r, row in table.iterrows():
        assert math.isclose(row["work × layers / n²d"], r * math.ceil((n - 1) / (r // 2)) / n)
    assert table["work × layers / n²d"].is_monotonic_decreasing
    assert abs(table.loc[4097, "work × layers / n²d"] - 2) < 0.01


def brute_pairs(n, window, n_global):
    """Count allowed pairs with loops, from the definition."""
    count = 0
    for i in range(n):
        for j in range(i + 1):
            if window is None or i - j < window or j < n_global:
                count += 1
    return count


@pytest.mark.parametrize("n,window,n_global", [(n, w, g) for n in (1, 5, 16, 40) for w in (1, 3, 4, 50)
                                               for g in (0, 1, 2, 7)])
def test_pair_formulas_match_loops_and_masks(n, window, n_global):
    expected = brute_pairs(n, window, n_global)
    assert tx.global_pairs(n, window, n_global) == expected
    assert int(tx.causal_mask(n, window, n_global).sum()) == expected
    if n_global == 0:
        assert tx.sliding_pairs(n, window) == expected
    assert tx.causal_pairs(n) == brute_pairs(n, None, 0) == int(tx.causal_mask(n).sum())


def test_pair_table_equal_column():
    table = tx.pair_table(cases=((9, 2, 1), (30, 7, 3)))
    assert table["equal"].all()
    assert table.loc[2, "allowed"] == brute_pairs(30, 7, 3)


def reach_by_mask_products(n, layers, window):
    """Boolean products of the real causal window mask: positions the last one depends on."""
    mask = tx.causal_mask(n, window).long()
    linked, counts = torch.eye(n, dtype=torch.long), []
    for _ in range(layers):
        linked = ((linked @ mask) > 0).long()
        counts.append(int(linked[-1].sum()))
    return counts


@pytest.mark.parametrize("layers,window", [(1, 1), (1, 4), (3, 2), (5, 4), (4, 7)])
def test_reach_of_a_window_stack_three_ways(layers, window):
    n = layers * window + 2
    formula = [tx.reach(L, k=window) for L in range(1, layers + 1)]
    assert reach_by_mask_products(n, layers, window) == formula
    assert tx.reach_after([1] * layers, k=window) == formula
    assert torch.equal(tx.causal_mask(n, window), tx.window_links(n, range(0, -window, -1)))


def test_trade_table_layers_by_search():
    """Search the layers a centred window needs to connect 1 and n with the real mask."""
    n, d = 40, 4
    for r in (3, 5, 9, 15):
        mask = tx.window_mask(n, r).long()
        linked, layers = mask.clone(), 1
        while not linked[0, n - 1]:
            linked = ((linked @ mask) > 0).long()
            layers += 1
        table = tx.trade_table(n=n, d=d, rs=(r,))
        assert table.loc[r, "layers to connect"] == layers
        assert table.loc[r, "work r·n·d"] == r * n * d


@pytest.mark.parametrize("call,argument", [
    (lambda: tx.window_mask(0, 3), "n"),
    (lambda: tx.window_mask(4, 4), "r"),
    (lambda: tx.band_slots(4, -1), "r"),
    (lambda: tx.banded_attention(torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 2), 2), "r"),
    (lambda: tx.banded_attention(torch.ones(3, 2), torch.ones(4, 2), torch.ones(3, 2), 3), "q, k, v"),
    (lambda: tx.attention_core(torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 2),
                                 torch.ones(3, 3)), "mask"),
    (lambda: tx.masked_flops(5, 0), "d"),
    (lambda: tx.blocked_flops(5, 2, 4), "r"),
    (lambda: tx.blocked_attention(torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 2), 2), "r"),
    (lambda: tx.blocked_attention(torch.ones(3, 2), torch.ones(4, 2), torch.ones(3, 2), 3), "q, k, v"),
    (lambda: tx.banded_flops(5, 2, 6), "r"),
    (lambda: tx.causal_mask(5, window=0), "window"),
    (lambda: tx.causal_mask(5, 2, n_global=-1), "n_global"),
    (lambda: tx.sliding_pairs(5, 0), "window"),
    (lambda: tx.global_pairs(5, 2, 1.5), "n_global"),
    (lambda: tx.reach(0, 4), "layers"),
    (lambda: tx.reach_after([1, 1], k=0), "k"),
    (lambda: tx.trade_table(n=8, d=2, rs=(4,)), "r"),
    (lambda: tx.time_call(print, min_runs=0), "min_runs"),
    (lambda: tx.time_table(ns=(8,), d=2, r=3, statistic="mean"), "statistic"),
    (lambda: tx.causal_time_table(ns=(8,), d=2, statistic="mean"), "statistic"),
    (lambda: tx.score_table_bytes(0), "n"),
])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=re.escape(argument)):
        call()
