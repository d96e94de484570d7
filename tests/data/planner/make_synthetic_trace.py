"""Generate synthetic_contention_trace.csv: a SYNTHETIC pre-training trace (not a recording).

Real recorded traces from the emulated cluster will sit beside it in the same format
(hetcluster.planner.traces). Until then this file stands in, generated from a documented
contention model that is deliberately NOT the planner's own queue model:

  * six devices modelled on a server, Jetson Xavier NX, Jetson TX2, Jetson Nano, Raspberry Pi 4
    and a phone (solo steps/s, idle and busy watts below);
  * every one of the 63 configurations "measured" for 200 steps;
  * throughput: a host capacity C = 0.8·Σr shrinking by 4 % per extra worker,
    C_n = C·(1 − 0.04·(n − 1)), shared max-min fairly (x_i = min(r_i, θ), Σx_i = min(Σr_i, C_n));
  * power: idle + (busy − idle)·x_i/r_i per device, summed over the participants;
  * 2 % log-normal noise on every measured throughput and power (seed 4).

Run: .venv/bin/python tests/data/planner/make_synthetic_trace.py
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from hetcluster.planner.throughput import waterfill  # exact max-min shares of one capacity

DEVICES = [  # name, solo steps/s, idle W, busy W
    ("server", 24.0, 65.0, 210.0),
    ("xavier", 7.5, 4.5, 15.0),
    ("tx2", 4.8, 3.5, 12.0),
    ("nano", 2.4, 1.8, 7.5),
    ("rpi4", 1.1, 2.7, 6.4),
    ("phone", 0.8, 0.9, 4.5),
]
CAPACITY_FRACTION = 0.8
OVERHEAD_PER_WORKER = 0.04
NOISE = 0.02
STEPS = 200


def main() -> None:
    rng = np.random.default_rng(4)
    rates = np.array([d[1] for d in DEVICES])
    capacity = CAPACITY_FRACTION * rates.sum()
    rows = []
    for k in range(1, len(DEVICES) + 1):
        for subset in itertools.combinations(range(len(DEVICES)), k):
            cap = capacity * (1.0 - OVERHEAD_PER_WORKER * (k - 1))
            x = waterfill(rates[list(subset)], max(cap, rates[list(subset)].max())) if k > 1 else rates[list(subset)]
            x = x * np.exp(rng.normal(0.0, NOISE, x.size))
            power = sum(
                DEVICES[i][2] + (DEVICES[i][3] - DEVICES[i][2]) * min(xi / DEVICES[i][1], 1.0)
                for i, xi in zip(subset, x)
            )
            power *= float(np.exp(rng.normal(0.0, NOISE)))
            total = float(x.sum())
            time_s = STEPS / total
            per_device = {DEVICES[i][0]: int(round(xi * time_s)) for i, xi in zip(subset, x)}
            rows.append({
                "devices": "+".join(DEVICES[i][0] for i in subset),
                "steps": STEPS,
                "time_s": round(time_s, 6),
                "steps_per_s": round(total, 6),
                "power_w": round(power, 4),
                "idle_power_w": DEVICES[subset[0]][2] if k == 1 else "",
                "steps_per_s_std": round(NOISE * DEVICES[subset[0]][1], 6) if k == 1 else "",
                "class_key": "",
                "per_device_steps": json.dumps(per_device) if k > 1 else "",
            })
    out = Path(__file__).with_name("synthetic_contention_trace.csv")
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
