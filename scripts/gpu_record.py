"""Measure the book's GPU timings and write a record the pages can show.

    python scripts/gpu_record.py [--out PATH]

On a machine with a CUDA device, this runs Part 2's wall-time table (one self-attention step
against one recurrent loop, d = 512), the same n·d² multiply-adds as one product and as an n-step
chain ("waiting isolated"), and Part 5's masked against banded attention (d = 64, r = 17), every
timer synchronised with the device (tx.time_call). It writes one JSON record: the device, the
torch and transformers versions, the date, and the tables. Without CUDA it exits 2 with one line.
The pages show a committed record, labelled with its device and date: measurements/*.json, and
its numbers in tx_part4.RECORDED_H200 (a test checks that the two agree). To adopt a new record,
commit its file and update that constant; the build checks its values as kind `recorded`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tx_part4 as tx  # noqa: E402

MEASUREMENTS = Path(__file__).resolve().parent.parent / "measurements"


def waiting_isolated(ns, d: int = 512, device: str = "cuda", seed: int = 0) -> dict:
    """Milliseconds for n·d² multiply-adds as one product x U and as an n-step chain h ← tanh(x_i + h U)."""
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(d, d, generator=g) / math.sqrt(d)).to(device)
    rows = {}
    with torch.no_grad():
        for n in ns:
            x = torch.randn(n, d, generator=g).to(device)

            def chain(x=x):
                h = torch.zeros(1, d, device=x.device)
                for i in range(x.shape[0]):               # step i waits for step i − 1
                    h = torch.tanh(x[i:i + 1] + h @ U)
                return h

            product = tx.time_call(lambda x=x: x @ U)["median"]
            waited = tx.time_call(chain)["median"]
            rows[str(n)] = {"one product ms": 1e3 * product, "chain ms": 1e3 * waited,
                            "chain/product": waited / product}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write (default measurements/DEVICE-DATE.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device on this machine: the record needs a GPU")
    import transformers

    wall = tx.wall_time_table(ns=(16, 64, 256, 1024, 4096), d=512, device="cuda")
    band = tx.time_table(ns=(1024, 4096, 16384), d=64, r=17, device="cuda")
    record = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
        "method": "scripts/gpu_record.py: median of timed runs after a warm-up, synchronised with the device",
        "wall_time": {str(n): row for n, row in wall[["attention ms", "loop ms"]].to_dict("index").items()},
        "waiting_isolated": waiting_isolated((64, 256, 1024, 4096)),
        "banded": {str(n): row for n, row in band.to_dict("index").items()},
    }
    if args.out is None:
        slug = "".join(c if c.isalnum() else "-" for c in record["device"].lower()).strip("-")
        args.out = MEASUREMENTS / f"{slug}-{record['date']}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {record['device']}, torch {record['torch']}, {record['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
