"""Part 8's installed command, `why-self-attention`: models by path or Hugging Face id, side by side, the
defaults a price rests on, per-layer overrides priced layer by layer, and one-line errors. Offline: the Hub
tests write a Hugging Face cache of their own (HF_HOME, the cache's own layout) and never reach the network."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import tx_part4 as tx

ROOT = Path(__file__).resolve().parents[2]
COMMAND = shutil.which("why-self-attention", path=str(Path(sys.executable).parent))
LLAMA = tx.CONFIG_DIR / "llama-3-8b.json"

#: A small Llama, written as a Hub model's config.json.
TINY_LLAMA = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64, max_position_embeddings=256)


def hub_cache(home: Path, repo: str, config: dict) -> Path:
    """Write a Hugging Face cache under `home` as huggingface_hub lays it out: the repository's folder, its
    `refs/main` naming a snapshot, and the snapshot's config.json. Returns the file."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    path = snapshot / "config.json"
    path.write_text(json.dumps(config))
    return path


def run(*argv, home: Path | None = None) -> subprocess.CompletedProcess:
    """The installed command, offline, with HF_HOME at `home` where one is given."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if home is not None:
        env["HF_HOME"] = str(home)
        env.pop("HF_HUB_CACHE", None)
    return subprocess.run([COMMAND, *argv], capture_output=True, text=True, timeout=300, env=env)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, stderr
    return lines[0]


# ── the installed command ──────────────────────────────────────────────────────────────────

def test_pyproject_installs_the_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"why-self-attention": "tx_part4:main"}
    assert COMMAND, "why-self-attention is not installed beside this Python (make env installs it)"


def test_help_lists_the_commands_and_an_unknown_one_exits_2(capsys):
    tx.main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("tables", "model", "kv"))
    with pytest.raises(SystemExit) as exit_:
        tx.main(["prices"])
    assert exit_.value.code == 2 and "unknown command 'prices'" in one_error_line(capsys.readouterr().err)


# ── names: a Hub id from the local cache, equal to the same file given as a path ───────────

def test_hub_id_from_the_local_cache_equals_the_file(tmp_path):
    path = hub_cache(tmp_path / "hf", "acme/tiny-llama", TINY_LLAMA)
    both = run("model", "acme/tiny-llama", str(path), "--json", home=tmp_path / "hf")
    assert both.returncode == 0, both.stderr
    by_id, by_path = json.loads(both.stdout)
    assert by_id["model"] == "acme/tiny-llama" and by_id["config"] == str(path)
    for result in (by_id, by_path):
        del result["model"]
    assert by_id == by_path
    text = run("model", "acme/tiny-llama", home=tmp_path / "hf")
    assert text.returncode == 0 and "acme/tiny-llama" in text.stdout and "2 attention layer(s)" in text.stdout


@pytest.mark.parametrize("name,named", [
    ("acme/no-such-model", "not in the Hugging Face cache and HF_HUB_OFFLINE is set"),
    ("not a valid//id", "neither a file nor a valid Hugging Face model id"),
])
def test_a_missing_or_invalid_id_exits_2_with_one_line_naming_it(name, named, tmp_path):
    (tmp_path / "hf").mkdir()
    result = run("model", name, home=tmp_path / "hf")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert name in line and named in line
    if "OFFLINE" in named:
        assert f"hf download {name} config.json" in line


def test_a_missing_file_is_named_as_a_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        tx.main(["model", str(tmp_path / "nope.json")])
    assert exit_.value.code == 2 and "no such file" in one_error_line(capsys.readouterr().err)


# ── several models side by side ────────────────────────────────────────────────────────────

def test_two_models_two_columns_in_order_and_a_json_list(capsys):
    mistral = tx.CONFIG_DIR / "mistral-7b-v0.1.json"
    tx.main(["model", str(mistral), str(LLAMA)])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("model "))
    assert header.split() == ["model", "mistral-7b-v0.1", "llama-3-8b"]
    assert out.index("== mistral-7b-v0.1") < out.index("== llama-3-8b")
    tx.main(["model", str(LLAMA), str(mistral), "--json"])
    results = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in results] == ["llama-3-8b", "mistral-7b-v0.1"]
    assert [r["kv_bytes_per_token"] for r in results] == [131072, 131072]
    assert results[1]["max_tokens"]["24"] is None                  # Mistral's windows: no limit


def test_models_text_fits_76_columns():
    priced = {name: tx.price_model(tx.CONFIG_DIR / f"{name}.json") for name in ("gpt2", "llama-3-8b")}
    assert max(len(line) for line in tx.models_text(priced).splitlines()) <= 76


# ── no silent default ───────────────────────────────────────────────────────────────────────

def test_a_config_without_its_layer_count_names_the_default(tmp_path, capsys):
    from transformers import LlamaConfig

    fields = {k: v for k, v in json.loads(LLAMA.read_text()).items() if k != "num_hidden_layers"}
    path = tmp_path / "no-layers.json"
    path.write_text(json.dumps(fields))
    tx.main(["model", str(path)])
    out = capsys.readouterr().out
    default = LlamaConfig().num_hidden_layers
    assert f"\n  not in the config: num_hidden_layers = {default}, LlamaConfig's default\n" in out
    tx.main(["model", str(path), "--json"])
    (result,) = json.loads(capsys.readouterr().out)
    assert {"field": "num_hidden_layers", "value": default, "from": "LlamaConfig's default"} in result["defaults"]
    assert sum(layer["layers"] for layer in result["layers"]) == default
    tx.main(["model", str(LLAMA), "--json"])                         # the file sets it: no such entry
    (whole,) = json.loads(capsys.readouterr().out)
    assert "num_hidden_layers" not in {d["field"] for d in whole["defaults"]}


def test_derived_fields_are_named_as_derived():
    fields = {k: v for k, v in json.loads(LLAMA.read_text()).items() if k != "head_dim"}
    (row,) = [d for d in tx.filled_in(fields) if d["field"] == "head_dim"]
    assert row == {"field": "head_dim", "value": 128, "from": "derived by LlamaConfig"}


# ── per-layer overrides (per_layer_config), priced layer by layer ───────────────────────────

#: Gemma 4 gives its full-attention layers a head size of their own (global_head_dim, kept in per_layer_config).
GEMMA4 = dict(model_type="gemma4_text", num_hidden_layers=4, hidden_size=64, intermediate_size=64,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8,
              vocab_size=64, vocab_size_per_layer_input=64, hidden_size_per_layer_input=8, num_kv_shared_layers=0,
              layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"])


@pytest.mark.parametrize("fields,own", [
    (GEMMA4, {"head_dim": 32}),
    ({"model_type": "dots3_note"}, {"kv_lora_rank": 1024, "num_attention_heads": 64, "num_key_value_heads": 64,
                                    "qk_nope_head_dim": 192}),
], ids=["gemma4_text", "dots3_note"])
def test_per_layer_fields_priced_layer_by_layer_equal_the_whole_build(fields, own):
    config = tx.read_config(fields)
    assert config["per_layer_config"]                                # the class keeps each layer's own fields
    priced = tx.price_model(fields, tokens=(8192,))
    (with_own,) = [layer for layer in priced["layers"] if layer["own"]]
    assert with_own["own"] == own and with_own["formula"] == "exact"  # the formula, with the layer's own fields
    model = tx.meta_model(config)                                    # every layer, as the model is
    measured = {n: tx.measure_cache(model, n) for n in (3, 7, 9)}
    assert priced["kv_bytes_per_token"] == (measured[7] - measured[3]) // 4
    fixed = {(r["kind"], r["window"], tuple(sorted(r["own"].items()))): (r["bytes_per_token"], r["state_bytes"])
             for r in priced["layers"] if r["formula"] != "exact"}
    for n, got in measured.items():                                  # whole conversations too
        assert tx.cache_bytes(config, n, measured=fixed) == got
