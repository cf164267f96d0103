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


def measure_record(machines, meta: dict, wall_ns=WALL_NS,
                   waiting_ns=WAITING_NS, d: int = 512) -> dict:
    """The record: for each (column, device, threads) of `machines`, Part
    2's wall-time table, n: [attention ms, loop ms], and (but for the
    column "cpu1") its waiting isolated, n: [tanh(x + x U) ms, the chain
    h ← tanh(x_t + h U) ms] (tx.price_of_waiting); n as JSON's text."""
    record = {**meta, "wall_time": {}, "waiting_isolated": {}}
    for where, device, threads in machines:
        torch.set_num_threads(threads)
        wall = tx.wall_time_table(ns=wall_ns, d=d, device=device)
        for n, row in wall.iterrows():
            record["wall_time"].setdefault(str(n), {})[where] = [
                row["attention ms"], row["loop ms"]]
        if where == "cpu1":                  # the page shows no waiting
            continue
        g = torch.Generator().manual_seed(0)
        U = (torch.randn(d, d, generator=g) / math.sqrt(d)).to(device)
        for n in waiting_ns:
            x = torch.randn(n, d, generator=g).to(device)
            price = tx.price_of_waiting(x, U)
            record["waiting_isolated"].setdefault(str(n), {})[where] = [
                price["product ms"], price["chain ms"]]
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
    machines = (("gpu", "cuda", threads), ("cpu16", "cpu", threads),
                ("cpu1", "cpu", 1))
    record = measure_record(machines, {
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
