"""Running mean and variance of observation (or return) vectors, merged batch by batch."""

import numpy as np


class RunningMeanStd:
    """Running mean/variance of vectors of shape (dim,), merged batch by batch (Chan et al. parallel update).

    Arrays are updated IN PLACE (np.copyto / slice assignment) so an external broadcast of arrays() into
    these same objects takes effect.

    Attributes:
        mean: (dim,) float64, starts at 0.
        var: (dim,) float64 population variance, starts at 1.
        count: (1,) float64 number of vectors seen, starts at 1e-4 (a tiny prior so the first merge never
            divides by zero; it weighs 1e-4 of one sample).
        clip: normalized values are clipped to [-clip, clip].
        epsilon: added to var before the square root.
    """

    def __init__(self, dim: int, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.dim = dim
        self.clip = clip
        self.epsilon = epsilon
        self.mean = np.zeros(dim, dtype=np.float64)
        self.var = np.ones(dim, dtype=np.float64)
        self.count = np.full(1, 1e-4, dtype=np.float64)

    def arrays(self) -> list[np.ndarray]:
        """[mean (dim,), var (dim,), count (1,)]: the very arrays this object uses, not copies."""
        return [self.mean, self.var, self.count]

    def copy(self) -> "RunningMeanStd":
        """An independent snapshot with the same settings and statistics."""
        other = RunningMeanStd(self.dim, self.clip, self.epsilon)
        for dst, src in zip(other.arrays(), self.arrays(), strict=True):
            np.copyto(dst, src)
        return other

    def update(self, x: np.ndarray) -> None:
        """Merge the vectors x (N, dim) into the statistics; N == 0 leaves them unchanged."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected shape (N, {self.dim}), got {x.shape}")
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(axis=0)
        batch_var = x.var(axis=0)
        old_count = self.count[0]
        total = old_count + n
        delta = batch_mean - self.mean
        # Chan et al.: combine the two sums of squared deviations, corrected for the shift between the means.
        m2 = self.var * old_count + batch_var * n + delta**2 * (old_count * n / total)
        np.copyto(self.mean, self.mean + delta * (n / total))
        np.copyto(self.var, m2 / total)
        self.count[0] = total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """clip((x - mean) / sqrt(var + epsilon), -clip, clip) as float32; x (N, dim) -> (N, dim)."""
        z = (np.asarray(x, dtype=np.float64) - self.mean) / np.sqrt(self.var + self.epsilon)
        return np.clip(z, -self.clip, self.clip).astype(np.float32)
