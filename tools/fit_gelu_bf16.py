"""Prints the polynomial Q of ``gelu_erf_bf16`` (kernels/cpu/common.h).

gelu_erf_bf16 is the erf GELU of the CPU kernels whose result is rounded to bf16 next.
It computes h = erfc(z) / 2 (z = |x| / sqrt 2) as 2^Q(s), s = z / 5.5 in [0, 1], so Q
approximates log2(erfc(5.5 s) / 2). Q(0) is held at exactly -1 (h = 1/2 at x = 0, so
x / 2 rounds as torch's does); the other eight coefficients are a weighted
least-squares fit on Chebyshev points, the weights raised where the error is largest
(iteratively, towards the minimax fit). The script prints the coefficients rounded to
float32, the fit's error and the error of Q evaluated in float32 in the kernel's
order of operations (Estrin's scheme), both as relative errors of h.

    python tools/fit_gelu_bf16.py
"""

from __future__ import annotations

import numpy as np
import torch

DEGREE = 8
ROUNDS = 40


def target(s: np.ndarray) -> np.ndarray:
    """log2(erfc(5.5 s) / 2) in float64 (erfc computed directly: no 1 - erf)."""
    z = torch.from_numpy(5.5 * s)
    return np.log2(torch.special.erfc(z).numpy() / 2.0)


def fit(degree: int = DEGREE) -> np.ndarray:
    s = (np.cos(np.linspace(0.0, np.pi, 6000)) + 1.0) / 2.0
    f = target(s) + 1.0  # the part left after Q(0) = -1
    v = np.vander(s, degree + 1, increasing=True)[:, 1:]
    w = np.ones_like(s)
    for _ in range(ROUNDS):
        c = np.linalg.lstsq(v * w[:, None], f * w, rcond=None)[0]
        e = np.abs(v @ c - f)
        w *= (e / e.max()) ** 0.3 + 0.1
    return np.concatenate([[-1.0], c])


def estrin_f32(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Q(s) in float32, in gelu_erf_bf16's order (pairs, then s^2, s^4, s^8)."""
    s = s.astype(np.float32)
    c = c.astype(np.float32)
    s2 = s * s
    s4 = s2 * s2
    s8 = s4 * s4
    p = [c[2 * i] + s * c[2 * i + 1] for i in range(4)]
    return s8 * c[8] + ((p[0] + s2 * p[1]) + s4 * (p[2] + s2 * p[3]))


def main() -> None:
    c = fit()
    s = np.linspace(0.0, 1.0, 400_001)
    ln2 = np.log(2.0)
    fit_err = np.abs(np.vander(s, DEGREE + 1, increasing=True) @ c - target(s)).max() * ln2
    f32_err = np.abs(estrin_f32(s, c).astype(np.float64) - target(s)).max() * ln2
    print(f"degree {DEGREE}: fit error {fit_err:.2e}, float32 evaluation {f32_err:.2e}")
    print("coefficients, s^0 .. s^8:")
    print(", ".join(f"{x:.9e}f" for x in c.astype(np.float32)))


if __name__ == "__main__":
    main()
