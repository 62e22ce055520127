"""An independent pass@k reference for the host-study tests: Chen et al. 2021 eq. 1 with math.comb."""
import math

import numpy as np


def comb_pass(succ_PxZ, k):
    """Per task pass@k = 1 - C(n - c, k) / C(n, k) (n samples, c successes; Chen et al. 2021 eq. 1), task mean."""
    out = []
    for row in np.asarray(succ_PxZ, bool):
        n, c = len(row), int(row.sum())
        out.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
    return float(np.mean(out))
