"""The build's closing time report: every notebook and the total, a WARNING line past the budget."""

import book


def test_the_report_lists_every_notebook_and_the_total_within_budget():
    lines = book.budget_report({"02_b": 3.0, "01_a": 12.5}, 30.0)
    assert [line.split()[0] for line in lines[1:]] == ["01_a", "02_b", "whole"]
    assert "12.5 s" in lines[1] and "30.0 s" in lines[3]
    assert not any("WARNING" in line or "OVER" in line for line in lines)


def test_a_notebook_over_budget_is_named_in_a_warning_line():
    slow = book.BUDGET_NOTEBOOK + 0.5
    lines = book.budget_report({"01_a": 1.0, "05_slow": slow}, book.BUDGET_BUILD + 1)
    warnings = [line for line in lines if line.startswith("WARNING:")]
    assert len(warnings) == 2
    assert "notebooks/05_slow.md" in warnings[0] and f"{slow:.1f} s" in warnings[0]
    assert "the build took" in warnings[1]
    assert "OVER BUDGET" in next(line for line in lines if "05_slow" in line)
    assert "OVER BUDGET" not in next(line for line in lines if "01_a" in line)


def test_the_build_does_not_fail_on_time(monkeypatch, capsys):
    """build() prints the report after every check, and returns normally
    past the budget."""
    from bookbuild import execute, ledger, numbers, pairs, site

    nothing = lambda *args, **kwargs: None
    for module, step in ((pairs, "check_sync"), (ledger, "write_ledger"),
                         (ledger, "write_exercises"), (site, "html"),
                         (numbers, "check_numbers")):
        monkeypatch.setattr(module, step, nothing)
    monkeypatch.setattr(execute, "glued_values", lambda: {})
    monkeypatch.setattr(execute, "execute",
                        lambda **kwargs: {"03_late": book.BUDGET_NOTEBOOK * 2})
    book.build()
    out = capsys.readouterr().out
    assert "WARNING: notebooks/03_late.md took" in out and "make book:" in out


def test_an_incremental_build_is_not_held_to_the_fresh_budget():
    """An edit runs few notebooks: the report says how many, and warns only per notebook."""
    lines = book.budget_report({"01_a": 3.0}, book.BUDGET_BUILD + 5, fresh=False)
    assert "whole build (1 executed)" in lines[-1] and "OVER" not in lines[-1]
    assert not any(line.startswith("WARNING:") for line in lines)


def test_the_fresh_build_budget_is_forty_seconds():
    assert book.BUDGET_BUILD == 40.0
