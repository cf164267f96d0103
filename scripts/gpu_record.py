"""Measure Part 2's timings on a CUDA machine and write the record the
book shows, in exactly the format `tx.recorded` reads.

    python scripts/gpu_record.py [--out PATH]

It times Part 2's wall-time table (attention against a recurrent loop,
d = 512) and the same n·d² multiply-adds as one product and as an n-step
chain, on the GPU, on all the CPU's threads and on one (tx.time_call
synchronises with the device), into measurements/DEVICE-DATE.json. To
show a new record, commit it and name it in tx_part4.RECORDED.
"""

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

import tx_part4 as tx

MEASUREMENTS = Path(__file__).resolve().parent.parent / "measurements"
WALL_NS = (16, 64, 256, 1024, 4096)
WAITING_NS = (64, 256, 1024, 4096)


def waiting_isolated(ns, d: int, device: str, seed: int = 0) -> dict:
    """n: [the batched product tanh(x + x U) ms, the n-step chain
    h ← tanh(x_t + h U) ms], timed by Part 2's tx.price_of_waiting."""
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(d, d, generator=g) / math.sqrt(d)).to(device)
    rows = {}
    for n in ns:
        x = torch.randn(n, d, generator=g).to(device)
        price = tx.price_of_waiting(x, U)
        rows[n] = [price["product ms"], price["chain ms"]]
    return rows


def measure(device: str, threads: int, wall_ns=WALL_NS,
            waiting_ns=WAITING_NS, d: int = 512) -> tuple[dict, dict]:
    """One machine's columns: n: [attention ms, loop ms] and
    n: [product ms, chain ms], on `device` with `threads` CPU threads."""
    torch.set_num_threads(threads)
    wall = tx.wall_time_table(ns=wall_ns, d=d, device=device)
    rows = {n: [row["attention ms"], row["loop ms"]]
            for n, row in wall.iterrows()}
    return rows, waiting_isolated(waiting_ns, d, device)


def build_record(columns: dict[str, tuple[dict, dict]], meta: dict) -> dict:
    """The record from each machine's columns ("gpu", "cpu16": all the
    CPU's threads, "cpu1"): the wall times of all three, the waiting of
    the first two, as JSON keeps them (n as text)."""
    record = {**meta, "wall_time": {}, "waiting_isolated": {}}
    for where, (wall, waiting) in columns.items():
        for n, row in wall.items():
            record["wall_time"].setdefault(str(n), {})[where] = row
        if where != "cpu1":
            for n, row in waiting.items():
                waited = record["waiting_isolated"].setdefault(str(n), {})
                waited[where] = row
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write "
                        "(default measurements/DEVICE-DATE.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device here: the record needs a GPU")
    import transformers

    threads = torch.get_num_threads()
    columns = {"gpu": measure("cuda", threads),
               "cpu16": measure("cpu", threads), "cpu1": measure("cpu", 1)}
    record = build_record(columns, {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "transformers": transformers.__version__, "cpu_threads": threads,
        "date": datetime.date.today().isoformat(),
        "method": "scripts/gpu_record.py: medians of timed runs after a "
                  "warm-up, synchronised with the device"})
    if args.out is None:
        slug = "".join(c if c.isalnum() else "-"
                       for c in record["device"].lower()).strip("-")
        args.out = MEASUREMENTS / f"{slug}-{record['date']}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")  # ASCII
    print(f"{args.out}: {record['device']}, torch {record['torch']}, "
          f"{record['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
