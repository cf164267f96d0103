"""Part 2 helpers against independent methods: networkx's longest path, a recursive walk, sums."""

import math
import random
import sys

import networkx as nx
import pytest
import torch

import tx_part4 as tx


def autograd_dag(t):
    """The autograd graph under t as a networkx DiGraph, edges from a node to its parents."""
    graph, todo, seen = nx.DiGraph(), [t.grad_fn], set()
    graph.add_node(t.grad_fn)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        for parent, _ in node.next_functions:
            if parent is not None:
                graph.add_edge(node, parent)
                todo.append(parent)
    return graph


def networkx_depth(t):
    """Second method: the longest path of the DAG, in nodes (networkx counts edges)."""
    return nx.dag_longest_path_length(autograd_dag(t)) + 1


def recursive_depth(t):
    """Third method for small graphs: the plain recursive walk, no memo."""
    def depth(node):
        parents = [p for p, _ in node.next_functions if p is not None]
        return 1 + max((depth(p) for p in parents), default=0)
    return depth(t.grad_fn)


def random_graph(seed, size=12):
    """A random computation: each new tensor mixes one or two earlier ones."""
    rng = random.Random(seed)
    leaves = [torch.randn(3, requires_grad=True) for _ in range(3)]
    values = list(leaves)
    for _ in range(size):
        a, b = rng.choice(values), rng.choice(values)
        op = rng.choice(["add", "mul", "sin", "exp_neg"])
        if op == "add":
            values.append(a + b)
        elif op == "mul":
            values.append(a * b)
        elif op == "sin":
            values.append(torch.sin(a))
        else:
            values.append(torch.exp(-a.abs()))
    return sum(values[3:])


@pytest.mark.parametrize("seed", range(12))
def test_graph_depth_matches_networkx_and_recursion_on_random_graphs(seed):
    out = random_graph(seed)
    assert tx.graph_depth(out) == networkx_depth(out) == recursive_depth(out)


@pytest.mark.parametrize("n,d", [(1, 4), (3, 8), (9, 16)])
def test_layers_match_networkx(n, d):
    Wq, Wk, Wv, W, U = tx.random_weights(5, d, seed=n, requires_grad=True)
    x = torch.randn(n, d)
    attention, recurrent = tx.self_attention_layer(x, Wq, Wk, Wv), tx.recurrent_layer(x, W, U)
    assert tx.graph_depth(attention) == networkx_depth(attention)
    assert tx.graph_depth(recurrent) == networkx_depth(recurrent) == recursive_depth(recurrent)


def test_a_chain_of_5000_links_needs_no_recursion():
    leaf = torch.ones(1, requires_grad=True)
    h = leaf
    for _ in range(5000):
        h = h * 1.0001                              # one MulBackward per link
    assert sys.getrecursionlimit() < 5000
    assert tx.graph_depth(h) == 5000 + 1            # 5,000 multiplications and the leaf
    assert tx.graph_depth(h) == networkx_depth(h)
    assert len(tx.longest_chain(h)) == 5001


def test_shared_nodes_are_measured_once():
    h = torch.ones(1, requires_grad=True)
    for _ in range(80):                             # 2^80 paths: an unmemoized walk never ends
        h = h + h
    assert tx.graph_depth(h) == 81 == networkx_depth(h)


def test_attention_depth_is_constant_and_the_recurrent_depth_grows():
    ns = (2, 5, 11, 23)
    table = tx.depth_table(ns=ns, d=8)
    assert table["self-attention"].nunique() == 1
    links = table["recurrent"].tolist()
    per_position = {(b - a) / (m - n) for a, b, n, m in zip(links, links[1:], ns, ns[1:])}
    assert len(per_position) == 1                   # the same links for every extra position
    assert per_position == {table["recurrent / n"].iloc[0]}


def test_longest_chain_has_graph_depth_links():
    Wq, Wk, Wv = tx.random_weights(3, 6, requires_grad=True)
    out = tx.self_attention_layer(torch.randn(4, 6), Wq, Wk, Wv)
    chain = tx.longest_chain(out)
    assert len(chain) == tx.graph_depth(out)
    assert chain[0] == type(out.grad_fn).__name__ and chain[-1] == "AccumulateGrad"


def test_a_tensor_without_history_has_depth_zero():
    assert tx.graph_depth(torch.ones(3)) == 0
    assert tx.longest_chain(torch.ones(3)) == []


def test_time_call_statistics():
    stats = tx.time_call(lambda: sum(range(2000)), min_runs=4, min_time=0.0)
    assert stats["runs"] == 4
    assert 0 < stats["q1"] <= stats["median"] <= stats["q3"]


def test_wall_time_table_shape():
    torch.set_num_threads(1)
    table = tx.wall_time_table(ns=(4, 8), d=16, min_time=0.0)
    assert list(table.index) == [4, 8]
    assert (table[["attention ms", "loop ms"]] > 0).all().all()
    assert (table[["attention runs", "loop runs"]] >= 3).all().all()
    for name in ("attention", "loop"):                 # the quartiles the figure draws, and the spread
        assert (table[f"{name} q1 ms"] <= table[f"{name} ms"]).all()
        assert (table[f"{name} ms"] <= table[f"{name} q3 ms"]).all()
        spread = table[f"{name} q3 ms"] - table[f"{name} q1 ms"]
        assert ((spread - table[f"{name} spread ms"]).abs() < 1e-9).all()


def test_waiting_arithmetic_against_repeated_addition():
    for steps, per_step in [(2048, 20e-6), (24, 20e-6), (7, 0.3)]:
        assert math.isclose(tx.waiting_time(steps, per_step), math.fsum([per_step] * steps))
    table = tx.waiting_table()
    assert math.isclose(table.loc["recurrent network", "ms"], 1e3 * math.fsum([20e-6] * 2048))


@pytest.mark.parametrize("positions", [1, 5, 12])
def test_time_slots_hold_every_position_once(positions):
    serial, parallel = tx.time_slots(positions, False), tx.time_slots(positions, True)
    assert serial.shape == (positions, positions) and parallel.shape == (1, positions)
    assert (serial.sum(0) == 1).all() and (parallel.sum(0) == 1).all()
    assert (serial.sum(1) == 1).all()               # one position in each slot


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="t must"):
        tx.graph_depth(3)
    with pytest.raises(ValueError, match="t must"):
        tx.longest_chain([1, 2])
    with pytest.raises(ValueError, match="count"):
        tx.random_weights(0, 4)
    with pytest.raises(ValueError, match="d must"):
        tx.depth_table(d=0)
    with pytest.raises(ValueError, match="n must"):
        tx.depth_table(ns=(4, -1))
    with pytest.raises(ValueError, match="min_runs"):
        tx.time_call(print, min_runs=0)
    with pytest.raises(ValueError, match="min_time"):
        tx.time_call(print, min_time=-1)
    with pytest.raises(ValueError, match="steps"):
        tx.waiting_time(0, 1e-6)
    with pytest.raises(ValueError, match="seconds_per_step"):
        tx.waiting_time(5, 0)
    with pytest.raises(ValueError, match="positions"):
        tx.time_slots(0, True)


@pytest.mark.parametrize("n,d", [(3, 4), (16, 8), (9, 32)])
def test_the_timed_layers_do_the_counted_work(n, d):
    """The attention step does 3nd² + 2n²d multiply-adds, the loop 2nd², as FlopCounterMode counts."""
    Wq, Wk, Wv, W, U = tx.random_weights(5, d)
    x = torch.randn(n, d)
    assert tx.flops(tx.self_attention_layer, x, Wq, Wk, Wv) == 2 * (3 * n * d * d + 2 * n * n * d)
    assert tx.flops(tx.recurrent_layer, x, W, U) == 2 * (2 * n * d * d)
    assert tx.flops(torch.matmul, x, U) == tx.flops(tx.recurrent_chain, x, U) == 2 * n * d * d


def test_time_call_without_warmup_counts_the_first_run():
    calls = []
    stats = tx.time_call(lambda: calls.append(1), min_runs=2, min_time=0.0, warmup=False)
    assert stats["runs"] == 2 and len(calls) == 2
    calls.clear()
    stats = tx.time_call(lambda: calls.append(1), min_runs=2, min_time=0.0)
    assert stats["runs"] == 2 and len(calls) == 3            # one warm-up, two timed


def test_price_of_waiting_times_both_ways():
    torch.set_num_threads(1)
    x, U = torch.randn(8, 16), tx.random_weights(1, 16)[0]
    price = tx.price_of_waiting(x, U)
    assert price["product ms"] > 0 and price["chain ms"] > 0
    assert math.isclose(price["chain / product"], price["chain ms"] / price["product ms"])
    assert price["steps runs"] >= 1 and price["chain runs"] >= 1   # shown beside the times


def test_price_of_waiting_warms_up_both_ways(monkeypatch):
    """The product, the independent steps and the chain each get a warm-up run first."""
    seen = []
    real = tx.time_call

    def spy(fn, *args, **options):
        seen.append(options.get("warmup", True))
        return real(fn, *args, **options)

    monkeypatch.setattr(tx, "time_call", spy)
    tx.price_of_waiting(torch.randn(4, 8), tx.random_weights(1, 8)[0])
    assert seen == [True, True, True]              # product, steps, chain


def test_restricted_attention_depth_is_the_same_at_every_length():
    Wq, Wk, Wv = tx.random_weights(3, 8, requires_grad=True)
    depths = set()
    for n in (18, 40, 300):
        x = torch.randn(n, 8)
        depths.add(tx.graph_depth(tx.banded_attention(x @ Wq, x @ Wk, x @ Wv, r=17)))
    assert len(depths) == 1


def test_recorded_tables_keep_the_record():
    wall, waiting = tx.recorded_tables()
    record = tx.recorded()
    assert list(wall.index) == list(record["wall_time"])
    assert wall.loc[4096, "GPU loop ms"] == record["wall_time"][4096]["gpu"][1]
    assert wall.loc[16, "1 thread attention ms"] == record["wall_time"][16]["cpu1"][0]
    gpu = record["waiting_isolated"][4096]["gpu"]
    assert math.isclose(waiting.loc[4096, "GPU chain / product"], gpu[1] / gpu[0])


def test_generation_takes_one_forward_pass_per_token():
    model = tx.hf_model(tx.ExampleModel(layers=1, width=32, heads=2, head_size=16, kv_heads=2,
                                        vocabulary=64, bytes_per_number=4))
    prompt = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(0))
    for use_cache in (True, False):
        passes, tokens = tx.forward_passes(model, prompt, 5, use_cache=use_cache)
        assert passes == len(tokens) == 5


# ── Part 2 alone on other machines: the number check and the sentences that follow the facts ──

@pytest.mark.slow
@pytest.mark.parametrize("cores", [1, 64])
def test_part2_alone_on_another_machine(run_alone, cores):
    """Part 2 run alone with 1 core and with 64 cores: every glued value passes the number check
    against numbers.toml, and the sentences about the clock follow its measurements."""
    import json

    from bookbuild import common, execute, numbers

    page = "02_sequential_steps"
    path = common.ROOT / "notebooks" / f"{page}.ipynb"
    # the facts go to the kernel's environment, not this process's
    notebook = run_alone(path, {tx.MACHINE_ENV: json.dumps({"cores": cores})})
    glued = execute.glued_in_notebook(notebook)
    expected = numbers.load_expected()[page]
    problems = numbers.compare({page: expected}, {page: glued})
    assert not problems, numbers.problem_table(problems)
    decided = [glued[f"{k}_lengths"].value for k in ("slower", "faster", "undecided")]
    assert sum(decided) == glued["time_lengths"].value   # every length counted once
    ratio = glued["time_ratio_4096"].value                # the clock's words follow the clock
    assert glued["attention_vs_loop_4096"].value == ("slower than" if ratio > 1 else "faster than")
    slope, in_step = glued["loop_slope"].value, glued["loop_in_step"]
    assert in_step.value == in_step.values[0 if 0.7 < slope < 1.3 else 1]
