"""The number check itself: drifts, missing and unexpected keys fail, with a readable table."""


import pytest

from bookbuild import common, execute, ledger, numbers
from bookbuild.execute import Glued
from bookbuild.numbers import compare, problem_table

EXPECTED = {
    "01_costs": {
        "core_27": {"kind": "exact", "value": 746496, "published": 746496},
        "ratio": {"kind": "close", "value": 0.5, "tol": 1e-6},
        "norm": {"kind": "seeded", "value": 0.297, "tol": 0.05},
        "wall_ms": {"kind": "measured", "value": 4.2},
        "grows": {"kind": "exact", "value": True},
    }
}


def glued(**changes):
    """The glued values of a build that matches EXPECTED, with some values changed."""
    values = {"core_27": 746496, "ratio": 0.5, "norm": 0.3, "wall_ms": 9.9, "grows": True}
    values.update(changes)
    return {"01_costs": {k: Glued(v) for k, v in values.items() if v is not None}}


def test_a_matching_build_passes():
    assert compare(EXPECTED, glued()) == []


def test_a_count_off_by_one_fails_naming_key_expected_and_value():
    problems = compare(EXPECTED, glued(core_27=746497))
    assert [(p.key, p.expected, p.got) for p in problems] == [("core_27", 746496, 746497)]
    table = problem_table(problems)
    assert "core_27" in table and "746,496" in table and "746,497" in table


def test_close_and_seeded_tolerances():
    assert compare(EXPECTED, glued(ratio=0.5 * (1 + 1e-8))) == []
    assert [p.key for p in compare(EXPECTED, glued(ratio=0.51))] == ["ratio"]
    assert compare(EXPECTED, glued(norm=0.31)) == []
    assert [p.key for p in compare(EXPECTED, glued(norm=0.5))] == ["norm"]


def test_measured_values_are_only_checked_to_be_numbers():
    assert compare(EXPECTED, glued(wall_ms=123.0)) == []
    assert [p.key for p in compare(EXPECTED, glued(wall_ms=float("nan")))] == ["wall_ms"]
    assert [p.key for p in compare(EXPECTED, glued(grows=False))] == ["grows"]


def test_a_missing_key_fails():
    problems = compare(EXPECTED, glued(ratio=None))
    assert [(p.key, p.reason.split(":")[0]) for p in problems] == [("ratio", "missing")]


def test_an_unexpected_key_fails():
    problems = compare(EXPECTED, glued(surprise=7))
    assert [(p.key, p.reason.split(":")[0]) for p in problems] == [("surprise", "unexpected")]


def test_a_page_that_did_not_run_fails():
    problems = compare(EXPECTED, {})
    assert [(p.page, p.reason) for p in problems] == [("01_costs", "page not executed")]


def test_a_type_change_is_a_drift():
    assert [p.key for p in compare(EXPECTED, glued(core_27=746496.0))] == ["core_27"]


def test_disagreeing_with_the_published_value_fails():
    expected = {"p": {"k": {"kind": "exact", "value": 5, "published": 6}}}
    assert [p.reason for p in compare(expected, {"p": {"k": Glued(5)}})] == [
        "disagrees with the companion articles"]


@pytest.mark.parametrize("value,seed,agrees", [
    (0.13262, 0.133, True), (3.2803e-05, 3.28e-05, True), (16.0, 16.0, True),
    (1.7204e-09, 1.72e-09, True), (0.0769, 0.08, True), (0.4, 0.4, True), (0.46, 0.4, False),
    (12288, 12288, True), (12289, 12288, False), (True, True, True),
])
def test_agreement_with_published_rounding(value, seed, agrees):
    assert numbers.agrees_with_published(value, seed) is agrees


def test_numbers_file_round_trip(tmp_path):
    data = {"01_costs": {
        "a": {"kind": "exact", "value": 12288, "published": 12288, "meaning": 'say "why"'},
        "cost.10.self-attention_n²d": {"kind": "close", "value": 1e-09, "tol": 1e-6},
        "flag": {"kind": "exact", "value": False},
    }}
    path = tmp_path / "numbers.toml"
    path.write_text(numbers.dump_expected(data, "# a header\n"), encoding="utf-8")
    assert numbers.load_expected(path) == data
    assert path.read_text(encoding="utf-8").startswith("# a header\n\n[01_costs]")


def test_an_unknown_kind_in_the_file_fails(tmp_path):
    path = tmp_path / "numbers.toml"
    path.write_text('[p]\nk = { kind = "roughly", value = 1 }\n', encoding="utf-8")
    with pytest.raises(common.BuildError, match="kind must be one of"):
        numbers.load_expected(path)


def test_the_committed_numbers_file_is_well_formed():
    expected = numbers.load_expected()
    assert set(expected) == {p.stem for p in common.notebook_sources()}, \
        "numbers.toml must have a table for every notebook, and no other"
    for page, keys in expected.items():
        assert keys, f"numbers.toml [{page}] is empty"


def execute_changed_page(run_alone, tmp_path, old: str, new: str):
    """Execute a copy of notebooks/01_costs.md with one line of its code changed, as a reader
    would change a cell (the count is defined on the page, in a saved cell)."""
    source = (common.NOTEBOOKS / "01_costs.md").read_text(encoding="utf-8")
    changed = source.replace(old, new, 1)
    assert changed != source, f"{old!r} is not on the page any more"
    page = tmp_path / "01_costs.md"
    page.write_text(changed, encoding="utf-8")
    return execute.glued_in_notebook(run_alone(page))


def test_changing_one_count_by_one_fails_the_check(run_alone, tmp_path):
    """The promise of the build: a count changed by one is caught, by key, old and new value."""
    glued_values = execute_changed_page(run_alone, tmp_path, "scores=n * n * d,", "scores=n * n * d + 1,")
    expected = numbers.load_expected()
    problems = compare({"01_costs": expected["01_costs"]}, {"01_costs": glued_values})
    drifted = {p.key: (p.expected, p.got) for p in problems}
    assert drifted["core_27"] == (746496, 746497)
    assert "core_27" in problem_table(problems)


def test_the_ledger_rows_are_a_table_with_a_status_each():
    """The ledger's tables are HTML that Sphinx passes through: a meaning's < and & are
    escaped, drift is shown."""
    expected = {"01_a": {"ok_key": {"kind": "exact", "value": 3, "meaning": "a < b & c"},
                         "t.8.n": {"kind": "exact", "value": 5}}}
    glued = {"01_a": {"ok_key": Glued(3), "t.8.n": Glued(6)}}
    text = ledger.ledger_text(expected, glued)
    rows = [line for line in text.splitlines() if line.startswith("<tr><td")]
    assert len(rows) == 2 and "a &lt; b &amp; c" in rows[0] and "<code>ok_key</code>" in rows[0]
    assert "table t, row 8" in rows[1]                                      # default meaning
    assert "✅ ok" in rows[0] and "❌ drifted" in rows[1]
    assert text.count('<table class="ledger table">') == 1
    assert "```{raw} html" in text and "## [01_a](../notebooks/01_a.md)" in text


def test_a_recorded_value_must_be_there_as_a_number():
    """A value from a committed GPU record: any number passes, a missing or non-number one fails."""
    expected = {"p": {"gpu_ms": {"kind": "recorded", "value": 0.99}}}
    assert numbers.compare(expected, {"p": {"gpu_ms": execute.Glued(1.7)}}) == []
    (problem,) = numbers.compare(expected, {"p": {"gpu_ms": execute.Glued("n/a")}})
    assert "recorded value must be a finite number" in problem.reason
    (problem,) = numbers.compare(expected, {"p": {}})
    assert problem.reason.startswith("missing")


def test_a_measured_span_passes_as_printed_and_free_text_fails():
    """A range glued as printed ("5.9 to 9.1", or one number where both ends print alike)
    is a measured value; any other text needs the phrase's `values`."""
    expected = {"p": {"span": {"kind": "measured", "value": "5.9 to 9.1"}}}
    for ok in ("5.1 to 10.8", "6.0", "1,024 to 4,096"):
        assert numbers.compare(expected, {"p": {"span": execute.Glued(ok)}}) == []
    for bad in ("faster than", "5.9 to", "to 9.1", ""):
        (problem,) = numbers.compare(expected, {"p": {"span": execute.Glued(bad)}})
        assert "a span such as" in problem.reason


def test_a_phrase_must_be_one_of_its_words():
    expected = {"p": {"band_vs_mask": {"kind": "measured", "value": "slower than",
                                       "values": ["slower than", "faster than"]}}}
    assert compare(expected, {"p": {"band_vs_mask": Glued("faster than")}}) == []
    problems = compare(expected, {"p": {"band_vs_mask": Glued("about as fast as")}})
    assert [p.key for p in problems] == ["band_vs_mask"]
    assert "one of" in problems[0].reason


def test_a_phrase_whose_words_changed_in_the_notebook_fails():
    """The words a phrase may take are compared whole, not only the one this
    build glued: a branch reworded in the notebook fails on every machine,
    not only on the one whose clock takes that branch."""
    expected = {"p": {"k": {"kind": "measured", "value": "slower than",
                            "values": ["slower than", "faster than"]}}}
    same = Glued("slower than", "measured", values=["faster than", "slower than"])
    assert compare(expected, {"p": {"k": same}}) == []
    reworded = Glued("slower than", "measured", values=["slower than", "quicker than"])
    (problem,) = compare(expected, {"p": {"k": reworded}})
    assert "differ from `values`" in problem.reason


def test_a_measured_string_without_values_fails():
    expected = {"p": {"k": {"kind": "measured", "value": "fast"}}}
    assert [p.key for p in compare(expected, {"p": {"k": Glued("fast")}})] == ["k"]


def test_a_claim_that_flips_fails_and_shows_its_margin():
    expected = {"p": {"band_wins": {"kind": "exact", "value": True, "threshold": 1.0}}}
    holds = Glued(True, "exact", None, 3.0, 1.0)
    assert compare(expected, {"p": {"band_wins": holds}}) == []
    flipped = Glued(False, "exact", None, 0.9, 1.0)
    problems = compare(expected, {"p": {"band_wins": flipped}})
    assert [(p.key, p.margin) for p in problems] == [("band_wins", "0.9 / 1 = 0.90")]
    assert "0.9 / 1 = 0.90" in problem_table(problems)


def test_a_claim_whose_threshold_changed_fails():
    expected = {"p": {"k": {"kind": "exact", "value": True, "threshold": 2.0}}}
    problems = compare(expected, {"p": {"k": Glued(True, "exact", None, 5.0, 1.0)}})
    assert [p.key for p in problems] == ["k"] and "threshold" in problems[0].reason


def test_the_ledger_flags_claims_near_their_threshold():
    expected = {"p": {"close": {"kind": "exact", "value": True, "threshold": 1.0},
                      "wide": {"kind": "exact", "value": True, "threshold": 1.0}}}
    glued = {"p": {"close": Glued(True, "exact", None, 1.5, 1.0),
                   "wide": Glued(True, "exact", None, 30.0, 1.0)}}
    text = ledger.ledger_text(expected, glued)
    assert "⚠ 1.5 / 1 = 1.50" in text and "30 / 1 = 30.00" in text
    assert "2 claims, 1 of them with a margin under 2" in text


def test_make_numbers_keeps_a_phrase_and_a_claim(tmp_path, monkeypatch):
    monkeypatch.setattr(numbers, "NUMBERS", tmp_path / "numbers.toml")
    glued = {"p": {"words": Glued("faster than", "measured", None, None, None,
                                  ["faster than", "slower than"]),
                   "wins": Glued(True, "exact", None, 4.0, 1.5)}}
    monkeypatch.setattr(numbers, "glued_values", lambda only=None: glued)
    numbers.accept_numbers()
    again = numbers.load_expected(tmp_path / "numbers.toml")
    assert again["p"]["words"]["values"] == ["faster than", "slower than"]
    assert again["p"]["wins"]["threshold"] == 1.5
    assert compare(again, glued) == []


def test_a_kind_the_notebook_states_must_match_the_file():
    """A notebook that now glues `wall_ms` as exact is checked as exact,
    not left checked as "a number"; a kind it does not state (the type's
    default) leaves the file's kind in charge."""
    stated = glued()
    stated["01_costs"]["wall_ms"] = Glued(9.9, kind="exact", stated=True)
    problems = compare(EXPECTED, stated)
    assert [p.key for p in problems] == ["wall_ms"]
    assert "glued as exact, numbers.toml says measured" in problems[0].reason
    # no kind stated: the default "close" of a float defers to the file
    assert compare(EXPECTED, glued(wall_ms=9.9)) == []
