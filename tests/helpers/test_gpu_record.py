"""The GPU record: scripts/gpu_record.py writes exactly what the book reads
(tx.recorded, then Part 2's recorded_tables). Small CPU tables stand in
for the GPU's: the same code, the same file, read back."""

from __future__ import annotations

import json

import pytest

import gpu_record  # scripts/ is on the path (tests/conftest.py)
import tx_part4 as tx


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A record of three machines' columns, measured small on the CPU."""
    machines = (("gpu", "cpu", 1), ("cpu16", "cpu", 2), ("cpu1", "cpu", 1))
    meta = {"device": "a CPU standing in", "torch": "2", "date": "2026-01-01",
            "transformers": "5", "cpu_threads": 2, "method": "a test"}
    made = gpu_record.measure_record(machines, meta, wall_ns=(8, 16), waiting_ns=(8, 16), d=16)
    path = tmp_path_factory.mktemp("record") / "cpu-2026-01-01.json"
    path.write_text(json.dumps(made))
    return path, made


def test_the_book_reads_what_the_script_writes(written):
    path, made = written
    record = tx.recorded(path)
    assert record["device"] == "a CPU standing in"
    assert record["wall_time"][16]["cpu1"] == made["wall_time"]["16"]["cpu1"]
    assert "cpu1" not in made["waiting_isolated"]["16"]
    wall, waiting = tx.recorded_tables(record)
    assert list(wall.index) == [8, 16] and list(waiting.index) == [8, 16]
    assert wall.loc[16, "GPU loop ms"] == made["wall_time"]["16"]["gpu"][1]
    assert wall.loc[8, "2 threads attention ms"] == made["wall_time"]["8"]["cpu16"][0]
    product, chain = made["waiting_isolated"]["16"]["cpu16"]
    assert waiting.loc[16, "2 threads chain / product"] == chain / product


def test_the_committed_record_has_every_column_the_page_shows():
    record = tx.recorded()
    for n, row in record["wall_time"].items():
        assert set(row) == {"gpu", "cpu16", "cpu1"}, n
        assert all(len(pair) == 2 for pair in row.values()), n
    for n, row in record["waiting_isolated"].items():
        assert set(row) == {"gpu", "cpu16"}, n
    assert "RECORDED_H200" not in dir(tx)          # one copy: measurements/
