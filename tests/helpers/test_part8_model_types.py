"""Part 8 on every causal-LM type transformers knows: each type's default config, priced on the meta device.

The walk builds transformers' own default config of each type in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`,
prices it with `price_layers` (its first layers that hold every kind, on the meta device), and counts
how many types get an answer and how many of those the formula explains in part or in whole."""

import collections

import pytest

import tx_part4 as tx


def price_every_type() -> dict[str, object]:
    """model_type → the rows of price_layers, or the exception that stopped it."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    answers = {}
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            answers[model_type] = tx.price_layers(tx.read_config({"model_type": model_type}), lengths=(3, 7))
        except Exception as error:                # noqa: BLE001 — a type that does not build or run on meta
            answers[model_type] = error
    return answers


def verdict(rows) -> str:
    """A model's formula verdict over its kinds of layer."""
    kinds = {row["formula"] for row in rows}
    return kinds.pop() if len(kinds) == 1 else "partial"


@pytest.mark.slow
def test_every_causal_lm_type_is_priced_where_it_builds():
    answers = price_every_type()
    priced = {t: rows for t, rows in answers.items() if not isinstance(rows, Exception)}
    no_cache = {t for t, rows in priced.items() if any("no cache" in row["why"] for row in rows)}
    with_cache = {t: rows for t, rows in priced.items() if t not in no_cache}
    verdicts = collections.Counter(verdict(rows) for rows in with_cache.values())
    print(f"\n{len(answers)} causal-LM types: {len(priced)} priced ({len(no_cache)} of them return no cache); "
          f"of the {len(with_cache)} with a cache, formula exact {verdicts['exact']}, partial "
          f"{verdicts['partial']}, measured only {verdicts['measured only']}")
    assert len(with_cache) >= 120
    assert verdicts["exact"] + verdicts["partial"] > 0.8 * len(with_cache)
    for model_type in ("llama", "mistral", "mixtral", "gpt2", "falcon", "deepseek_v3", "qwen2_moe", "mamba2"):
        assert verdict(priced[model_type]) == "exact", model_type
    refused = {t: e for t, e in answers.items() if isinstance(e, ValueError) and "not known" in str(e)}
    assert not refused                            # every listed type is known to its own release


def priced_against_whole_build(model_type: str) -> dict:
    """One type's default config: priced as the command prices it (`price_model`), and built whole on the
    meta device, where two prompts measure its bytes a token. Either may fail; each failure is kept."""
    answer = {}
    try:
        config = tx.read_config({"model_type": model_type})
        model = tx.meta_model(config)                       # every layer, as the model is
        short, long = (tx.measure_cache(model, n) for n in (3, 7))
        answer["measured"] = (long - short) // 4
    except Exception as error:                    # noqa: BLE001 — it does not build or run on meta
        answer["build_error"] = error
        return answer
    try:
        answer["priced"] = tx.price_model({"model_type": model_type}, tokens=(8192,))["kv_bytes_per_token"]
    except Exception as error:                    # noqa: BLE001
        answer["price_error"] = error
    return answer


#: A seeded sample of the causal-LM types (the issue's walk drew 40), and the per-layer type it named.
SAMPLE_SEED, SAMPLE_SIZE = 29, 40


@pytest.mark.slow
def test_a_sample_of_types_is_priced_and_agrees_with_the_whole_build():
    """Of the sampled types that build whole on the meta device, at least 95 % are priced, and every priced
    one costs, in bytes a token, what its whole meta-device build measures."""
    import random

    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    sample = sorted(set(random.Random(SAMPLE_SEED).sample(types, SAMPLE_SIZE)) | {"dots3_note"})
    answers = {t: priced_against_whole_build(t) for t in sample}
    built = {t: a for t, a in answers.items() if "build_error" not in a}
    priced = {t: a for t, a in built.items() if "priced" in a}
    disagree = {t: (a["priced"], a["measured"]) for t, a in priced.items() if a["priced"] != a["measured"]}
    print(f"\n{len(sample)} sampled types: {len(built)} build whole on meta, {len(priced)} of them priced; "
          f"not priced: {sorted(set(built) - set(priced))}; disagree (priced, measured): {disagree}")
    assert len(built) >= 20
    assert len(priced) >= 0.95 * len(built)
    assert not disagree
    assert "dots3_note" in priced                 # per-layer overrides (per_layer_config), priced layer by layer
