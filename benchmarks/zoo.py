"""Write the light CNN zoo (seeded weights, calibrated BatchNorm) to benchmarks/zoo/.

    python benchmarks/zoo.py [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import os

from opwarden import zoo

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "zoo"))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for path in zoo.build_all(a.out, seed=a.seed):
        print(path)
