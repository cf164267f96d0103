"""Part 8 helpers against independent methods: real transformers caches built on the meta device
and read tensor by tensor here, configs built in the tests (not shipped), searches, closed forms,
and the command line's JSON and its one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tx_part4 as tx

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(tx.CONFIG_DIR.glob("*.json"))


def cache_of(config: dict, tokens: int, layers: int | None = None) -> tuple[int, list[tuple[str, tuple]]]:
    """Method 2 without tx's measuring helper: build on meta, run a prompt, read every cache tensor."""
    model = tx.meta_model(config, layers)
    with torch.no_grad():
        cache = tx.model_cache(model(torch.zeros((1, tokens), dtype=torch.long, device="meta"), use_cache=True))
    total, shapes = 0, []
    for layer in cache.layers:
        held = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        held += list(getattr(layer, "conv_states", {}).values()) + list(getattr(layer, "recurrent_states", {}).values())
        held = [t for t in held if t is not None]
        total += sum(t.numel() * t.element_size() for t in held)
        shapes.append((type(layer).__name__, tuple(tuple(t.shape) for t in held)))
    return total, shapes


# ── configs built here, not shipped: one for each rule ─────────────────────────────────────

SMALL = dict(vocab_size=64, hidden_size=64, intermediate_size=96, max_position_embeddings=256)

BUILT = {
    # grouped keys and values with an explicit head_dim (32, not 64 / 4 = 16)
    "gqa_head_dim": dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, **SMALL),
    "qwen3_head_dim": dict(model_type="qwen3", num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=24, **SMALL),
    # a window that the config switches off
    "window_off": dict(model_type="qwen2", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       sliding_window=4, use_sliding_window=False, max_window_layers=0, **SMALL),
    # the same window switched on from layer 1 up (max_window_layers)
    "window_on_from_1": dict(model_type="qwen2", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                             sliding_window=4, use_sliding_window=True, max_window_layers=1, **SMALL),
    # a window on every layer
    "mistral_window": dict(model_type="mistral", num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, sliding_window=5, **SMALL),
    # window and global layers alternate, with a head_dim of its own
    "alternating": dict(model_type="gemma2", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, sliding_window=4, **SMALL),
    # a compressed latent (MLA), dense first layer then experts
    "mla": dict(model_type="deepseek_v2", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                first_k_dense_replace=1, **SMALL),
    # state only
    "mamba": dict(model_type="mamba", num_hidden_layers=2, hidden_size=16, state_size=4, conv_kernel=3, expand=2,
                  intermediate_size=32, vocab_size=64),
    # a hybrid: attention in layer 1 of every 2
    "hybrid": dict(model_type="jamba", num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                   num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                   expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
                   mamba_d_state=4, mamba_d_conv=3, mamba_expand=2, mamba_dt_rank=4, vocab_size=64),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_formula_equals_meta_cache_for_built_configs(name):
    config = tx.read_config(BUILT[name])
    lengths = (1, 3, 9) if config["model_type"] in ("mamba", "jamba") else (1, 3, 4, 5, 9, 17)
    for n in lengths:
        measured, _ = cache_of(config, n)
        assert tx.cache_bytes(config, n) == measured, (name, n)


def test_explicit_head_dim_is_used_not_width_over_heads():
    config = tx.read_config(BUILT["gqa_head_dim"])
    assert tx.head_size(config) == 32 != config["hidden_size"] // config["num_attention_heads"]
    _, shapes = cache_of(config, 3)
    assert shapes[0][1] == ((1, 2, 3, 32), (1, 2, 3, 32))        # kv heads, tokens, head_dim
    assert tx.token_bytes(config, "attention") == 2 * 2 * 32 * 2


def test_use_sliding_window_false_keeps_every_token():
    off, on = tx.read_config(BUILT["window_off"]), tx.read_config(BUILT["window_on_from_1"])
    assert [w for _, w in tx.layer_kinds(off)] == [None, None]
    assert [w for _, w in tx.layer_kinds(on)] == [None, 4, 4]
    _, shapes_off = cache_of(off, 9)
    _, shapes_on = cache_of(on, 9)
    assert [s[1][0][2] for s in shapes_off] == [9, 9]            # tokens kept per layer
    assert [s[1][0][2] for s in shapes_on] == [9, 3, 3]          # transformers keeps window − 1


def test_alternating_layers_gemma2():
    config = tx.read_config(BUILT["alternating"])
    assert tx.layer_kinds(config) == [("attention", 4), ("attention", None)] * 2
    _, shapes = cache_of(config, 9)
    assert [s[1][0][2] for s in shapes] == [3, 9, 3, 9]


def test_explicit_layer_types_win():
    config = tx.read_config({**BUILT["window_off"], "use_sliding_window": True,
                             "layer_types": ["full_attention", "sliding_attention"]})
    assert [w for _, w in tx.layer_kinds(config)] == [None, 4]


def test_mla_latent_counted_once():
    config = tx.read_config(BUILT["mla"])
    assert tx.token_bytes(config, "latent") == (16 + 8) * 2      # not × 2, not × heads
    _, shapes = cache_of(config, 5)
    assert shapes == [("DynamicLayer", ((1, 1, 5, 16), (1, 1, 5, 8)))] * 3


def test_mamba_state_is_fixed_and_float32():
    config = tx.read_config(BUILT["mamba"])
    sizes = {cache_of(config, n)[0] for n in (1, 4, 11)}
    assert sizes == {tx.cache_bytes(config, 0)}
    inner = 2 * 16
    assert tx.state_bytes(config, "mamba") == inner * 3 * 2 + inner * 4 * 4


def test_hybrid_layers_and_bytes():
    config = tx.read_config(BUILT["hybrid"])
    assert [k for k, _ in tx.layer_kinds(config)] == ["mamba", "attention", "mamba", "attention"]
    growth = tx.cache_bytes(config, 10) - tx.cache_bytes(config, 9)
    assert growth == 2 * tx.token_bytes(config, "attention") == 2 * (2 * 2 * 8 * 2)


# ── the shipped configs ─────────────────────────────────────────────────────────────────────

def test_shipped_configs_each_with_a_source():
    configs = tx.shipped_configs()
    assert len(configs) == 11
    assert {"llama-2-7b", "jamba-v0.1", "deepseek-v2-lite", "mixtral-8x7b", "gpt2"} <= set(configs)
    for name, config in configs.items():
        assert "/" in config["_source"] and "config.json" in config["_source"], name


def test_known_figures():
    configs = tx.shipped_configs()
    per_token = {name: tx.cache_bytes(c, 1) - tx.cache_bytes(c, 0) for name, c in configs.items()}
    assert per_token["llama-2-7b"] == 512 * tx.KIB
    assert per_token["llama-3-8b"] == 128 * tx.KIB
    assert per_token["deepseek-v2-lite"] == 27 * 576 * 2
    assert tx.cache_bytes(configs["llama-2-13b"], 8192) == 6_710_886_400 == int(6.25 * tx.GIB)


def test_cache_check_table_all_equal_small():
    configs = {k: tx.read_config(v) for k, v in BUILT.items()}
    table = tx.cache_check_table(configs, lengths=(2, 7), state_lengths=(2,))
    assert table["equal"].all() and len(table) == 2 * 7 + 2


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_config_whole_model_on_meta(path):
    """Every layer of the real architecture, not only the first ones the page builds."""
    config = tx.read_config(path)
    n = 5 if config["model_type"] in ("mamba", "jamba") else 4100
    measured, _ = cache_of(config, n)
    assert measured == tx.cache_bytes(config, n)


def test_layers_to_build_holds_every_kind_in_order():
    configs = tx.shipped_configs()
    built = {name: tx.layers_to_build(c) for name, c in configs.items()}
    assert built == {"deepseek-v2-lite": 2, "gemma-2-9b": 2, "gpt2": 1, "jamba-v0.1": 5, "llama-2-13b": 1,
                     "llama-2-7b": 1, "llama-3-8b": 1, "mamba-130m": 1, "mistral-7b-v0.1": 1,
                     "mixtral-8x7b": 1, "qwen2.5-7b": 1}


# ── weights, memory, crossing: against searches and closed forms ───────────────────────────

def test_meta_weights_equal_a_real_model_and_active_experts():
    config = tx.read_config(BUILT["mla"])
    total, read = tx.meta_weights(config)
    from transformers import AutoModelForCausalLM
    real = AutoModelForCausalLM.from_config(tx.transformers_config(config))
    assert total == sum(p.numel() for p in real.parameters())
    routed = sum(p.numel() for name, p in real.named_parameters() if ".experts." in f".{name}.")
    assert read == total - routed + routed * 2 // 4


def test_max_tokens_by_linear_search():
    config = tx.read_config(BUILT["alternating"])
    free = 40_000
    n = 0
    while tx.cache_bytes(config, n + 1) <= free:
        n += 1
    assert tx.max_tokens(config, free) == n
    assert tx.max_tokens(tx.read_config(BUILT["mamba"]), 10 ** 6) is None          # a state never grows
    assert tx.max_tokens(tx.read_config(BUILT["mistral_window"]), 10 ** 6) is None  # every layer windowed


def test_crossing_closed_form_for_full_attention():
    """n²/2 · P = n · W  ⇒  n = 2W / P, P = layers × heads × 2 × head size."""
    config = tx.shipped_configs()["llama-3-8b"]
    w = 7_000_000_000
    p = 32 * 32 * 2 * 128
    assert tx.crossing_tokens(config, w) == -(-2 * w // p)
    assert tx.crossing_tokens(tx.shipped_configs()["mistral-7b-v0.1"], w) is None
    assert tx.crossing_tokens(tx.shipped_configs()["mamba-130m"], 1) is None


def test_costs_of_the_page():
    configs = tx.shipped_configs()
    weights = {"llama-2-7b": (6_738_415_616, 6_738_415_616), "jamba-v0.1": (51_570_323_328, 12_000_000_000)}
    acc = tx.Accelerator()
    llama = tx.model_costs(configs["llama-2-7b"], weights["llama-2-7b"], acc)
    assert llama["kv_bytes_per_token"] == 524_288 and llama["state_bytes"] == 0
    free = 24 * tx.GIB - 2 * 6_738_415_616
    assert llama["max_tokens"][24] == free // 524_288
    jamba = tx.model_costs(configs["jamba-v0.1"], weights["jamba-v0.1"], acc)
    assert jamba["weights_fit"] == {24: False, 80: False}
    table = tx.costs_table({"llama-2-7b": llama, "jamba-v0.1": jamba}, acc)
    assert table.loc["jamba-v0.1", "tokens in 80 GiB"] == "no room"


# ── reading configs: paths, dicts, objects, and errors that name the problem ────────────────

def test_read_config_from_path_dict_and_object():
    from transformers import Qwen2Config

    by_path = tx.read_config(tx.CONFIG_DIR / "qwen2.5-7b.json")
    obj = Qwen2Config(**{k: v for k, v in by_path.items() if not k.startswith("_") and k != "model_type"})
    by_object = tx.read_config(obj)
    for n in (10, 200_000):
        assert tx.cache_bytes(by_object, n) == tx.cache_bytes(by_path, n) == tx.cache_bytes(dict(by_path), n)


@pytest.mark.parametrize("change,named", [
    ({"model_type": "no_such_model"}, "model_type 'no_such_model' is not known to transformers"),
    ({"model_type": None}, "no model_type"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": -8}, "head_dim"),
])
def test_read_config_errors_name_the_field(change, named):
    config = {**BUILT["gqa_head_dim"], **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        tx.read_config(config)


def test_missing_fields_take_the_config_class_defaults():
    """A field the config leaves out is the class's default, as for the model transformers builds."""
    from transformers import DeepseekV2Config, LlamaConfig, MambaConfig

    mla = tx.read_config({k: v for k, v in BUILT["mla"].items() if k != "kv_lora_rank"})
    assert mla["kv_lora_rank"] == DeepseekV2Config().kv_lora_rank
    mamba = tx.read_config({k: v for k, v in BUILT["mamba"].items() if k != "state_size"})
    assert mamba["state_size"] == MambaConfig().state_size
    llama = tx.read_config({k: v for k, v in BUILT["gqa_head_dim"].items() if k != "num_key_value_heads"})
    assert llama["num_key_value_heads"] == llama["num_attention_heads"] == 4
    assert tx.read_config({"model_type": "llama"})["hidden_size"] == LlamaConfig().hidden_size


def test_read_config_file_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        tx.read_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        tx.read_config(bad)


# ── the command line ────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_cli_json_on_each_shipped_config(path, capsys):
    tx.main(["model", str(path), "--json", "--memory-gib", "24", "80"])
    (result,) = json.loads(capsys.readouterr().out)              # a list, one object a model
    config = tx.read_config(path)
    assert result["kv_bytes_per_token"] == tx.cache_bytes(config, 1) - tx.cache_bytes(config, 0)
    assert result["state_bytes"] == tx.cache_bytes(config, 0)
    assert result["weights"] > 0 and set(result["max_tokens"]) == {"24.0", "80.0"}
    assert sum(layer["layers"] for layer in result["layers"]) == config["num_hidden_layers"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case,named", [
    ("missing_file", "no such file"),
    ("malformed", "not valid JSON"),
    ("zero_layers", "num_hidden_layers must be a positive integer"),
    ("unknown_type", "model_type 'not_a_model' is not known to transformers"),
    ("no_type", "no model_type"),
    ("no_meta", "(model_type 'bart'): transformers"),
    ("memory", "--memory-gib[0] must be a positive number"),
    ("tokens", "--tokens[0] must be a positive integer"),
    ("bandwidth", "--tb-per-second must be a positive number"),
    ("bytes", "--bytes must be one of"),
])
def test_cli_errors_exit_2_with_one_line(case, named, tmp_path, capsys):
    good = str(tx.CONFIG_DIR / "llama-3-8b.json")
    argv = {
        "missing_file": [str(tmp_path / "nope.json")],
        "malformed": [write(tmp_path, "bad.json", "{")],
        "zero_layers": [write(tmp_path, "zero.json", json.dumps({"model_type": "llama", "num_hidden_layers": 0}))],
        "unknown_type": [write(tmp_path, "odd.json", json.dumps({"model_type": "not_a_model"}))],
        "no_type": [write(tmp_path, "none.json", json.dumps({"hidden_size": 8}))],
        # an encoder-decoder that cannot run on the meta device: it builds, then fails
        "no_meta": [write(tmp_path, "bart.json", json.dumps({"model_type": "bart", "encoder_layers": 1,
                                                             "decoder_layers": 1, "d_model": 16}))],
        "memory": [good, "--memory-gib", "0"],
        "tokens": [good, "--tokens", "-5"],
        "bandwidth": [good, "--tb-per-second", "0"],
        "bytes": [good, "--bytes", "3"],
    }[case]
    with pytest.raises(SystemExit) as exit_:
        tx.main(["model", *argv])
    assert exit_.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and named in error_lines[0]


def test_cli_runs_as_a_script():
    """The real command line, once: a table for a shipped config, and exit 2 on a missing file."""
    script = ROOT / "scripts" / "tx_part4.py"
    ok = subprocess.run([sys.executable, str(script), "model", str(tx.CONFIG_DIR / "mistral-7b-v0.1.json")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "window 4,096" in ok.stdout and "no limit" in ok.stdout
    bad = subprocess.run([sys.executable, str(script), "model", "no/such/config.json"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("no such file: no/such/config.json")


def test_kv_subcommand_still_works(capsys):
    tx.main(["kv", "--layers", "32", "--heads", "32", "--kv-heads", "8", "--head-size", "128"])
    assert "128.00 KiB a token" in capsys.readouterr().out


# ── the forms the page prices: MLA on its latent, decode without the input embedding ────────

def test_latent_pairs_counted_in_the_expanded_form_of_a_whole_pass():
    """A latent layer's pairs over a whole pass use the expanded form a prompt read whole is
    computed in: a score over qk_nope_head_dim + qk_rope_head_dim numbers and a mix over
    v_head_dim, for every head (decoding's absorbed form is priced apart, on the page)."""
    config = tx.read_config(BUILT["mla"])
    n, heads, layers = 10, 4, 3
    per_head = (8 + 8) + 8                                       # score on nope + rope, mix on v
    assert tx.count_model_pairs(config, n) == n * n / 2 * heads * per_head * layers
    deepseek = tx.shipped_configs()["deepseek-v2-lite"]
    w = 2_000_000_000
    expanded = 27 * 16 * (192 + 128)
    assert tx.crossing_tokens(deepseek, w) == -(-2 * w // expanded)


def test_decode_reads_the_weights_a_token_uses_not_the_input_embedding():
    configs = tx.shipped_configs()
    llama = configs["llama-2-7b"]
    total = 6_738_415_616
    costs = tx.model_costs(llama, (total, total), tx.Accelerator())
    embedding = 32_000 * 4096
    assert costs["decode_bytes"] == (total - embedding) * 2 + tx.cache_bytes(llama, 8192)
    assert costs["decode_seconds"] == costs["decode_bytes"] / 1e12
    mamba = configs["mamba-130m"]                                 # tied: the output head reads it whole
    tied = tx.model_costs(mamba, (1000, 1000), tx.Accelerator())
    assert tied["decode_bytes"] == 1000 * 2 + tx.cache_bytes(mamba, 8192)


def test_learned_positions_bound_every_length(capsys):
    """GPT-2 has a learned table of 1,024 positions: no length past it runs, whatever the memory."""
    configs = tx.shipped_configs()
    gpt2 = configs["gpt2"]
    assert tx.position_limit(gpt2) == gpt2["max_position_embeddings"] == 1024
    assert tx.position_limit(configs["llama-3-8b"]) is None          # rotary: computed
    assert tx.position_limit(configs["mamba-130m"]) is None          # no positions
    costs = tx.model_costs(gpt2, tx.meta_weights(gpt2), tx.Accelerator())
    assert costs["max_tokens"] == {24: 1024, 80: 1024}
    row = tx.costs_table({"gpt2": costs}).loc["gpt2"]
    assert row["position table"] == 1024 and row["tokens in 24 GiB"] == 1024
    for column in ("GiB at 8,192", "GiB at 131,072", "ms a token at 8,192", "pairs overtake at (whole pass)"):
        assert row[column] == "cannot run", column
    tx.main(["model", str(tx.CONFIG_DIR / "gpt2.json")])
    out = capsys.readouterr().out
    assert "cannot run" in out and "692,299" not in out
    tx.main(["model", str(tx.CONFIG_DIR / "gpt2.json"), "--json"])
    assert json.loads(capsys.readouterr().out)[0]["position_limit"] == 1024


# ── any model transformers builds: names, kinds, formula against measurement ────────────────

TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=96, max_position_embeddings=256)

#: Configs built here for the kinds the formula covers (each must be "exact" on every kind).
COVERED = {
    # GPT-2 names its sizes n_layer, n_head, n_embd
    "gpt2_names": dict(model_type="gpt2", n_layer=2, n_head=4, n_embd=32, vocab_size=64, n_positions=64),
    # Falcon-style multi_query: one key-value head for every query head
    "falcon_multi_query": dict(model_type="falcon", num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                               multi_query=True, vocab_size=64),
    "bigcode_multi_query": dict(model_type="gpt_bigcode", n_layer=2, n_head=4, n_embd=32, multi_query=True,
                                vocab_size=64, n_positions=64),
    # a mixture of experts (Mixtral naming), every layer full attention
    "mixtral": dict(model_type="mixtral", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    num_local_experts=4, num_experts_per_tok=2, **TINY),
    # Qwen-MoE naming, with a shared expert
    "qwen2_moe": dict(model_type="qwen2_moe", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=32, **TINY),
    # DeepSeek-V3: MLA and a mixture of experts with shared experts, dense first layer
    "deepseek_v3": dict(model_type="deepseek_v3", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                        first_k_dense_replace=1, n_group=1, topk_group=1, **TINY),
    # Mamba-2: its convolution also holds the groups' B and C
    "mamba2": dict(model_type="mamba2", num_hidden_layers=2, hidden_size=32, state_size=8, conv_kernel=4, expand=2,
                   n_groups=2, num_heads=8, head_dim=8, vocab_size=64),
    # windows named layer by layer (Gemma 3's layer_types)
    "layer_types": dict(model_type="gemma3_text", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, sliding_window=4,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **TINY),
}


@pytest.mark.parametrize("name", sorted(COVERED))
def test_formula_covers_and_equals_the_measurement(name):
    config = tx.read_config(COVERED[name])
    layers = tx.price_layers(config, lengths=(3, 9))
    assert {row["formula"] for row in layers} == {"exact"}, layers
    for n in (1, 3, 9):                                      # and the totals, measured independently
        assert cache_of(config, n)[0] == tx.cache_bytes(config, n), n


def test_gpt2_names_read_as_the_standard_ones():
    config = tx.read_config(tx.CONFIG_DIR / "gpt2.json")
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]) == (12, 12, 768)
    assert tx.cache_bytes(config, 1) == 12 * 2 * 12 * 64 * 2


def test_multi_query_keeps_one_head():
    config = tx.read_config(COVERED["falcon_multi_query"])
    assert tx.key_value_heads(config) == 1
    assert tx.key_value_heads(tx.every_head_its_own(config)) == 8
    _, shapes = cache_of(config, 3)
    assert shapes[0][1][0][1] == 1                           # one key-value head in the real cache


def test_every_head_its_own_sets_falcons_own_count_too():
    """Falcon keeps its own count in num_kv_heads; a config with every head its own must not keep
    the grouped count there, or a model built from it would still group its heads."""
    config = tx.read_config(dict(model_type="falcon", num_hidden_layers=2, hidden_size=64,
                                 num_attention_heads=8, new_decoder_architecture=True,
                                 num_kv_heads=2, vocab_size=64))
    own = tx.every_head_its_own(config)
    assert own["num_kv_heads"] == own["num_key_value_heads"] == 8


#: Three configs, each written two ways: as its own config.json has it, and with the fields
#: that transformers derives from others written out, as a config saved by another release
#: may carry them (5.25 derives Falcon's num_key_value_heads from multi_query; GPT-2's
#: standard names; a grouped model's head_dim). (config, key-value heads, query heads)
REPRESENTATIONS = {
    "falcon": ([dict(model_type="falcon", num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                     multi_query=True, vocab_size=64)], 1, 8),
    "gpt2": ([dict(model_type="gpt2", n_layer=2, n_head=4, n_embd=32, vocab_size=64)], 4, 4),
    "grouped": ([dict(model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=128, vocab_size=64)], 2, 8),
}
REPRESENTATIONS["falcon"][0].append({**REPRESENTATIONS["falcon"][0][0], "num_key_value_heads": 1,
                                     "num_kv_heads": 8})
REPRESENTATIONS["gpt2"][0].append({**REPRESENTATIONS["gpt2"][0][0], "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "hidden_size": 32})
REPRESENTATIONS["grouped"][0].append({**REPRESENTATIONS["grouped"][0][0], "head_dim": 8})


@pytest.mark.parametrize("name", list(REPRESENTATIONS))
def test_a_config_prices_the_same_with_or_without_its_derived_fields(name):
    """The same bytes a token, and the same ratio when every head keeps its own key and value,
    whether or not the config carries the fields its class derives (the Falcon exercise broke on
    transformers 5.25 when it changed multi_query in a dict that still said one head)."""
    representations, kv_heads, heads = REPRESENTATIONS[name]
    prices = []
    for fields in representations:
        config = tx.read_config(fields)
        own = tx.every_head_its_own(config)
        assert (tx.key_value_heads(config), tx.key_value_heads(own)) == (kv_heads, heads), fields
        prices.append((tx.cache_bytes(config, 1), tx.cache_bytes(own, 1) / tx.cache_bytes(config, 1)))
    assert prices[0] == prices[1] and prices[0][1] == heads / kv_heads
    assert cache_of(tx.read_config(representations[1]), 1)[0] == prices[0][0]   # the real cache agrees


def test_measured_only_kinds_say_why_and_are_priced_from_the_measurement():
    """Qwen3-Next: gated-delta (linear attention) layers the formula does not know, full attention it does."""
    config = tx.read_config(dict(model_type="qwen3_next", num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, **TINY))
    layers = {row["kind"]: row for row in tx.price_layers(config, lengths=(3, 9))}
    assert layers["attention"]["formula"] == "exact"
    assert layers["linear_attention"]["formula"] == "measured only"
    assert "no rule" in layers["linear_attention"]["why"]
    fixed = {(r["kind"], r["window"], ()): (r["bytes_per_token"], r["state_bytes"])
             for r in layers.values() if r["formula"] != "exact"}
    for n in (3, 9, 20):                                     # the measured pricing holds at other lengths
        assert tx.cache_bytes(config, n, measured=fixed) == cache_of(config, n)[0]
    with pytest.raises(ValueError, match="linear_attention"):
        tx.cache_bytes(config, 3)                            # no formula, no measurement: it says so


def test_partial_when_a_layer_holds_more_than_the_formula_counts():
    verdict, why = tx.formula_verdict({"keys and values": [10, 20], "state": [0, 0]},
                                      [{"keys and values": 10, "state": 0, "indexer_keys": 4},
                                       {"keys and values": 20, "state": 0, "indexer_keys": 8}])
    assert verdict == "partial" and "indexer_keys" in why
    verdict, why = tx.formula_verdict({"keys and values": [10, 20], "state": [0, 0]},
                                      [{"keys and values": 12, "state": 0}, {"keys and values": 24, "state": 0}])
    assert verdict == "measured only" and "formula 20 bytes, measured 24" in why


@pytest.mark.parametrize("name,moe_layers,experts,chosen,width", [
    ("mixtral", 2, 4, 2, 96),            # Mixtral's experts are as wide as intermediate_size
    ("qwen2_moe", 2, 4, 2, 16),          # moe_intermediate_size; the shared expert is always read
    ("deepseek_v3", 2, 4, 2, 16),        # first layer dense; shared experts always read
])
def test_active_weights_follow_the_expert_fields(name, moe_layers, experts, chosen, width):
    """Routed experts by closed form (3 matrices of width × expert width, each expert, each MoE layer),
    against the count on the meta-built model."""
    config = tx.read_config(COVERED[name])
    total, read = tx.meta_weights(config)
    model = tx.meta_model(config)
    assert total == sum(p.numel() for p in model.parameters())
    routed = moe_layers * experts * 3 * config["hidden_size"] * width
    assert tx.routed_experts(model, experts) == routed
    assert read == total - routed + routed * chosen // experts
    shared = sum(p.numel() for n, p in model.named_parameters() if "shared_expert" in n)
    assert (shared > 0) == (name != "mixtral")               # read whole, inside `read`


def test_shipped_mixture_of_experts_totals():
    mixtral = tx.shipped_configs()["mixtral-8x7b"]
    total, read = tx.meta_weights(mixtral)
    assert round(total / 1e9, 1) == 46.7 and round(read / 1e9, 1) == 12.9     # the Mixtral paper's figures


def test_read_config_from_a_model_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text((tx.CONFIG_DIR / "llama-3-8b.json").read_text())
    assert tx.read_config(folder)["num_key_value_heads"] == 8
    with pytest.raises(ValueError, match="no such file"):
        tx.read_config(tmp_path)                             # a folder without a config.json


def test_cli_json_on_a_folder_gives_a_formula_for_each_kind(tmp_path, capsys):
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / "config.json").write_text((tx.CONFIG_DIR / "gemma-2-9b.json").read_text())
    tx.main(["model", str(folder), "--json"])
    (result,) = json.loads(capsys.readouterr().out)
    assert [(layer["window"], layer["formula"]) for layer in result["layers"]] == [(4096, "exact"), (None, "exact")]
    assert result["weights_read_per_token"] == result["weights"]


def test_cli_says_measured_only_and_why(tmp_path, capsys):
    path = write(tmp_path, "next.json", json.dumps(dict(model_type="qwen3_next", num_hidden_layers=4,
                                                        num_attention_heads=4, num_key_value_heads=2,
                                                        head_dim=16, **TINY)))
    tx.main(["model", path])
    out = capsys.readouterr().out
    assert "formula: measured only (no rule for this kind of layer)" in out and "formula: exact" in out


def test_a_model_with_chunked_layers_gets_no_crossing():
    """Llama 4's chunked layers compare pairs, but no rule counts them: the
    crossing says so, and is not a number that leaves those layers out."""
    config = tx.read_config({"model_type": "llama4_text", "num_hidden_layers": 4,
                             "hidden_size": 64, "intermediate_size": 128,
                             "intermediate_size_mlp": 128, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
                             "num_local_experts": 2, "attention_chunk_size": 8})
    kinds = {kind for kind, _ in tx.layer_kinds(config)}
    assert "chunked_attention" in kinds, kinds
    costs = tx.model_costs(config, tx.meta_weights(config), layers=tx.price_layers(config))
    assert costs["crossing_tokens"] == "not counted: chunked_attention", costs["crossing_tokens"]
    table = tx.costs_table({"llama4": costs})
    assert table.loc["llama4", "pairs overtake at (whole pass)"] == "not counted: chunked_attention"
