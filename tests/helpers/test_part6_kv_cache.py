"""Part 6 helpers against independent methods: real transformers caches, searches, sums, torch's nbytes."""

import re
from dataclasses import replace

import pytest
import torch

import tx_part4 as tx

TINY = tx.ExampleModel(layers=2, width=64, heads=8, head_size=8, bytes_per_number=2, vocabulary=64,
                       kv_heads=8)


def llama_cache_bytes(model, n, window=None):
    """Method 2 without tx's measuring helper: run a real model, read its cache tensors' shapes."""
    net = tx.hf_model(model, window)
    with torch.no_grad():
        cache = tx.model_cache(net(torch.arange(n)[None] % model.vocabulary, use_cache=True))
    total = 0
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            batch, heads, tokens, size = tensor.shape
            total += batch * heads * tokens * size * tensor.element_size()
    return total


@pytest.mark.parametrize("kv,layers,bytes_per_number", [(8, 2, 2), (2, 1, 2), (1, 3, 4), (4, 2, 4)])
@pytest.mark.parametrize("n", [1, 6, 23])
def test_formula_equals_real_cache(kv, layers, bytes_per_number, n):
    model = replace(TINY, kv_heads=kv, layers=layers, bytes_per_number=bytes_per_number)
    assert tx.kv_cache_bytes(n, model) == llama_cache_bytes(model, n)


@pytest.mark.parametrize("window,n", [(4, 2), (4, 3), (4, 4), (4, 9), (6, 30)])
def test_window_formula_equals_real_sliding_cache(window, n):
    """transformers keeps window − 1 past tokens in a DynamicSlidingWindowLayer."""
    model = replace(TINY, kv_heads=2)
    assert tx.kv_cache_bytes(n, model, window - 1) == llama_cache_bytes(model, n, window)


def test_cache_table_and_trace_all_equal():
    table = tx.cache_table(TINY, {"full": (8, None), "shared": (1, None), "window": (2, 5)}, lengths=(3, 11))
    assert table["equal"].all() and len(table) == 6
    trace = tx.cache_trace(replace(TINY, kv_heads=2), steps=9, window=4)
    assert trace["equal"].all()
    assert trace["kept"].tolist() == [1, 2, 3, 3, 3, 3, 3, 3, 3]


def test_decode_with_cache_matches_recomputing_the_prefix():
    """Greedy decoding with the cache writes exactly the tokens of recomputing everything at every
    step, and its scores agree to rounding (Part 6's decode_cache_matches)."""
    model = replace(TINY, bytes_per_number=4, layers=2)
    net = tx.hf_model(model, seed=3)
    prompt = torch.randint(0, model.vocabulary, (1, 5), generator=torch.Generator().manual_seed(3))
    cached, cached_scores = tx.greedy_decode(net, prompt, 12)
    full, full_scores = tx.greedy_decode(net, prompt, 12, use_cache=False)
    assert torch.equal(cached, full) and cached.shape == (1, 17)
    assert torch.equal(cached[:, :5], prompt)
    assert torch.allclose(cached_scores, full_scores, atol=1e-4)
    assert cached_scores.shape == (1, 12, model.vocabulary)


def test_decode_loop_really_uses_the_cache():
    """Feeding only the newest token without its cache gives other scores: the match above is
    not an accident of a model that ignores its past."""
    model = replace(TINY, bytes_per_number=4)
    net = tx.hf_model(model, seed=3)
    prompt = torch.randint(0, model.vocabulary, (1, 6), generator=torch.Generator().manual_seed(4))
    tokens, scores = tx.greedy_decode(net, prompt, 2)
    with torch.no_grad():
        alone = net(tokens[:, -2:-1]).logits[:, -1]        # the newest token with no cache at all
    assert not torch.allclose(alone, scores[:, 1], atol=1e-3)


def test_cache_layer_bytes_sums_every_key_and_value():
    net = tx.hf_model(replace(TINY, kv_heads=2, layers=3))
    with torch.no_grad():
        cache = tx.model_cache(net(torch.arange(7)[None], use_cache=True))
    per_layer = tx.cache_layer_bytes(cache)
    assert [kind for kind, _ in per_layer] == ["attention"] * 3
    assert sum(b for _, b in per_layer) == tx.kv_cache_bytes(7, replace(TINY, kv_heads=2, layers=3))


@pytest.mark.parametrize("kv", (8, 4, 2, 1))
def test_kv_projection_saving_equals_real_llama_parameters(kv):
    """The weights sharing removes, against the parameter counts of real Llama models on meta."""
    full = replace(TINY, layers=3)
    count = lambda m: sum(p.numel() for p in tx.hf_model(m, device="meta").parameters())  # noqa: E731
    shared = replace(full, kv_heads=kv)
    assert count(full) - count(shared) == tx.kv_projection_saving(shared)
    assert tx.with_grouped_projections(shared).parameters == shared.parameters - tx.kv_projection_saving(shared)


def test_example_model_bytes_per_token_second_formula():
    """Per layer: K and V tensors of shape (kv_heads, head_size) for one token."""
    model = tx.ExampleModel()
    per_layer = 2 * torch.empty(model.kv_heads, model.head_size, dtype=torch.bfloat16, device="meta").nbytes
    assert tx.kv_bytes_per_token(model) == model.layers * per_layer


def test_max_context_by_search():
    """Bisect the longest context whose weights + cache fit; compare."""
    for kv in (16, 4, 1):
        model, accel = replace(tx.ExampleModel(), kv_heads=kv), tx.ExampleAccelerator()
        fits = lambda n: model.weight_bytes + tx.kv_cache_bytes(n, model) <= accel.memory_bytes  # noqa: E731
        low, high = 0, 1 << 30
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        assert tx.max_context(model, accel) == low


def test_conversations_by_counting():
    """Add conversations one by one until the next does not fit."""
    model, accel = tx.ExampleModel(), tx.ExampleAccelerator()
    for tokens in (2048, 32768, 131072):
        used, count = model.weight_bytes, 0
        while used + tx.kv_cache_bytes(tokens, model) <= accel.memory_bytes:
            used += tx.kv_cache_bytes(tokens, model)
            count += 1
        assert tx.conversations_that_fit(tokens, model, accel) == count


def test_answer_time_is_sum_of_steps_and_closed_form():
    """Sum of an arithmetic series: the prompt's pass gives the first token, so answer − 1 steps ×
    (weights + cache at the mean context prompt + answer / 2) / bandwidth."""
    model, accel = tx.ExampleModel(), tx.ExampleAccelerator()
    for prompt, answer in ((1, 1), (100, 7), (8192, 256)):
        mean_context = prompt + answer / 2
        steps = answer - 1
        closed = steps * (model.weight_bytes + mean_context * tx.kv_bytes_per_token(model)) / accel.bytes_per_second
        assert tx.answer_seconds(prompt, answer, model, accel) == pytest.approx(closed, rel=1e-12)


def test_prefill_flops_second_formula():
    """2·params·n + 2 FLOPs × layers × n²/2 pairs × 2 products × width."""
    model = tx.ExampleModel()
    for n in (2, 512, 8192):
        expected = 2 * model.parameters * n + 2 * model.layers * (n * n // 2) * 2 * model.width
        assert tx.prefill_flops(n, model) == expected


def test_prefill_attention_flops_match_flop_counter():
    """The pair term against FlopCounterMode on one full attention core of the same width: the full
    grid has n² pairs, the causal count n²/2, so the counter sees exactly twice the causal FLOPs."""
    n, width = 64, 32
    model = tx.ExampleModel(layers=1, width=width, heads=1, head_size=width, kv_heads=1)
    q, k, v = torch.randn(n, width), torch.randn(n, width), torch.randn(n, width)
    counted = tx.flops(tx.attention_core, q, k, v)          # full grid: 2 products × n² × width × 2
    causal_flops = 2 * tx.count_pairs(n, model)               # 2 FLOPs a multiply-add, n²/2 pairs
    assert counted == 2 * causal_flops


def test_ridge_batch_by_counting_up():
    """Count batches up from 1 until a decode step does the accelerator's FLOPs per byte."""
    accel = tx.ExampleAccelerator()
    ratio = accel.flops_per_second / accel.bytes_per_second
    for kv, context in ((16, 0), (16, 32), (16, 64), (4, 128), (1, 500)):
        model = replace(tx.ExampleModel(), kv_heads=kv)
        batch = 1
        while tx.decode_step_flops(batch, context, model) < ratio * tx.decode_step_bytes(batch, context, model):
            batch += 1
        assert tx.ridge_batch(model, accel, context) == batch
    assert tx.ridge_batch(tx.ExampleModel(), accel, 0) == 100      # weights only: one FLOP a byte each


def test_ridge_context_is_the_last_cache_a_batch_can_fill():
    accel = tx.ExampleAccelerator()
    for kv in (16, 4, 1):
        model = replace(tx.ExampleModel(), kv_heads=kv)
        last = tx.ridge_context(model, accel)
        assert tx.ridge_batch(model, accel, last) is not None
        assert tx.ridge_batch(model, accel, last + 1) is None
    slow = tx.ExampleAccelerator(flops_per_second=1e12)     # one FLOP a byte: every cache length can
    assert tx.ridge_context(replace(tx.ExampleModel(), kv_heads=1), slow) is None


def test_decode_step_counts_one_conversation_as_before():
    model = tx.ExampleModel()
    assert tx.decode_step_bytes(1, 8192, model) == model.weight_bytes + tx.kv_cache_bytes(8192, model)
    assert tx.decode_step_flops(3, 10, model) == 3 * (2 * model.parameters + tx.decode_attention_flops(10, model))


@pytest.mark.parametrize("n,d,tile", [(1, 4, 128), (37, 8, 16), (200, 16, 64), (256, 32, 256)])
def test_tiled_attention_equals_the_core_and_its_byte_formula(n, d, tile):
    g = torch.Generator().manual_seed(n)
    q, k, v = torch.randn(3, 2, n, d, generator=g, dtype=torch.float64)   # two heads at once
    out, moved = tx.tiled_attention(q, k, v, tile)
    assert torch.allclose(out, tx.attention_core(q, k, v), rtol=1e-10, atol=1e-12)
    assert moved == 2 * tx.tiled_attention_bytes(n, d, tile, 8)


@pytest.mark.parametrize("n,d,bytes_per_number", [(5, 3, 4), (64, 16, 2), (8192, 64, 2)])
def test_naive_bytes_equal_the_counted_operations_on_meta_tensors(n, d, bytes_per_number):
    dtype = tx.DTYPES[bytes_per_number]
    q, k, v = (torch.empty(n, d, dtype=dtype, device="meta") for _ in range(3))
    assert tx.count_bytes_moved(tx.attention_core, q, k, v) == tx.naive_attention_bytes(n, d, bytes_per_number)


def test_tiled_bytes_fall_with_the_tile_and_stay_below_naive():
    sizes = [tx.tiled_attention_bytes(8192, 64, tile) for tile in (32, 64, 128, 256)]
    assert sizes == sorted(sizes, reverse=True)
    assert all(s < tx.naive_attention_bytes(8192, 64) for s in sizes)


def test_score_grid_bytes_equal_torch_nbytes():
    for rows, columns, nbytes, dtype in ((8, 8, 2, torch.bfloat16), (128, 64, 4, torch.float32),
                                         (8192, 8192, 2, torch.float16)):
        tensor = torch.empty(rows, columns, dtype=dtype, device="meta")
        assert tx.score_grid_bytes(rows, columns, nbytes) == tensor.nbytes


def test_cli_prints_a_table_for_another_model(capsys):
    tx.main(["kv", "--layers", "32", "--heads", "32", "--kv-heads", "8", "--head-size", "128",
             "--bytes", "2", "--tokens", "4096"])
    out = capsys.readouterr().out
    assert "128.00 KiB a token" in out and "4096" in out
    with pytest.raises(SystemExit):
        tx.main(["kv", "--kv-heads", "3"])
    assert "kv_heads" in capsys.readouterr().err


def test_cli_estimate_removes_the_smaller_kv_projections_and_marks_what_does_not_fit(capsys):
    """Without --parameters the weights are 12·width² a layer less the smaller W_K and W_V (as
    with_grouped_projections counts them); a length where no conversation fits has no decode time."""
    tx.main(["kv", "--layers", "32", "--heads", "32", "--kv-heads", "8", "--head-size", "128",
             "--tokens", "2048", "131072"])
    out = capsys.readouterr().out
    full = tx.ExampleModel(layers=32, width=4096, heads=32, head_size=128, kv_heads=8)
    assert f"{full.parameters - tx.kv_projection_saving(full):,} weights" in out
    shrunk = tx.with_grouped_projections(full)
    table = tx.kv_table(shrunk, tokens=(2048, 131072))
    assert table.loc[131072, "conversations"] == 0
    assert table["ms a token, one conversation alone"].isna().tolist() == [False, True]
    assert table["tokens a second, one conversation alone"].isna().tolist() == [False, True]
    assert table.loc[2048, "ms a token, one conversation alone"] == 1e3 * tx.decode_seconds(2048, shrunk)


def test_prefill_ridge_tokens_by_counting_up():
    """The first prompt length whose FLOPs reach the accelerator's ratio over the bytes of the
    weights and the cache it writes, found by trying every length."""
    for model, accelerator in ((tx.ExampleModel(), tx.ExampleAccelerator()),
                               (replace(tx.ExampleModel(), kv_heads=1, bytes_per_number=1),
                                tx.ExampleAccelerator(flops_per_second=3e14))):
        ratio = accelerator.flops_per_second / accelerator.bytes_per_second
        n = 1
        while tx.prefill_flops(n, model) < ratio * (model.weight_bytes + tx.kv_cache_bytes(n, model)):
            n += 1
        assert tx.prefill_ridge_tokens(model, accelerator) == n
    assert tx.prefill_ridge_tokens() == 101


def test_cache_table_says_none_for_no_window():
    table = tx.cache_table(TINY, {"full": (8, None), "window": (2, 5)}, lengths=(3,))
    assert table["window"].tolist() == ["none", 5]


@pytest.mark.parametrize("call,argument", [
    (lambda: tx.kv_cache_bytes(-1), "tokens"),
    (lambda: tx.kv_cache_bytes(5, kept=0), "kept"),
    (lambda: tx.decode_seconds(1.5), "context"),
    (lambda: tx.prefill_flops(0), "n"),
    (lambda: tx.answer_seconds(10, 0), "answer"),
    (lambda: tx.conversations_that_fit(0), "tokens"),
    (lambda: tx.score_grid_bytes(0), "rows"),
    (lambda: tx.score_grid_bytes(4, bytes_per_number=0), "bytes_per_number"),
    (lambda: tx.max_context(accelerator=tx.ExampleAccelerator(memory_bytes=1000)), "model"),
    (lambda: tx.hf_model(replace(TINY, bytes_per_number=3)), "bytes_per_number"),
    (lambda: tx.cache_trace(TINY, steps=0), "steps"),
    (lambda: tx.greedy_decode(None, torch.zeros(1, 2, dtype=torch.long), 0), "new_tokens"),
    (lambda: tx.decode_step_flops(0, 5), "batch"),
    (lambda: tx.tiled_attention(torch.ones(2, 4), torch.ones(2, 4), torch.ones(2, 4), 0), "tile"),
    (lambda: tx.naive_attention_bytes(0, 4), "n"),
    (lambda: tx.tiled_attention_bytes(4, 4, tile=0), "tile"),
    (lambda: tx.decode_step_bytes(2, -1), "tokens"),
])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=re.escape(argument)):
        call()
