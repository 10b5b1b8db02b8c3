"""RunningMeanStd: merged statistics equal those of the concatenated data; arrays() are updated in place."""

import numpy as np
import pytest

from algos import RunningMeanStd


def test_matches_concatenated_data():
    rng = np.random.default_rng(0)
    chunks = [rng.normal([3.0, -1.0, 0.0], [2.0, 0.5, 5.0], size=(n, 3)) for n in (1, 50, 0, 7, 300)]
    rms = RunningMeanStd(3)
    for chunk in chunks:
        rms.update(chunk)
    data = np.concatenate(chunks)
    # The prior (mean 0, var 1, count 1e-4) weighs 1e-4 of a sample: invisible at this tolerance.
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(rms.var, data.var(axis=0), rtol=1e-5)
    np.testing.assert_allclose(rms.count, [len(data) + 1e-4])
    assert rms.mean.dtype == rms.var.dtype == rms.count.dtype == np.float64

    # Exactly: the statistics of the data pooled with the prior as a pseudo-sample of weight 1e-4.
    total = len(data) + 1e-4
    mean = data.sum(axis=0) / total
    var = (1e-4 * (1.0 + mean**2) + ((data - mean) ** 2).sum(axis=0)) / total
    np.testing.assert_allclose(rms.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(rms.var, var, rtol=1e-12)


def test_empty_batch_is_a_no_op():
    rms = RunningMeanStd(2)
    rms.update(np.zeros((0, 2)))
    np.testing.assert_array_equal(rms.mean, [0.0, 0.0])
    np.testing.assert_array_equal(rms.var, [1.0, 1.0])
    np.testing.assert_array_equal(rms.count, [1e-4])


def test_wrong_shape_raises():
    with pytest.raises(ValueError):
        RunningMeanStd(3).update(np.zeros((4, 2)))


def test_arrays_are_updated_in_place():
    rms = RunningMeanStd(2)
    mean, var, count = rms.arrays()
    rms.update(np.array([[1.0, 2.0], [3.0, 6.0]]))
    assert mean is rms.mean and var is rms.var and count is rms.count
    np.testing.assert_allclose(mean, [2.0, 4.0], rtol=1e-4)

    # What an in-place broadcast does: write another normalizer's statistics into these arrays.
    source = RunningMeanStd(2)
    source.update(np.random.default_rng(1).normal(5.0, 3.0, size=(100, 2)))
    for dst, src in zip(rms.arrays(), source.arrays(), strict=True):
        dst[...] = src
    x = np.array([[4.0, 7.0], [0.0, 0.0]])
    np.testing.assert_array_equal(rms.normalize(x), source.normalize(x))


def test_normalize_is_float32_and_clipped():
    rms = RunningMeanStd(2, clip=3.0)
    rms.update(np.array([[0.0, 10.0], [2.0, 30.0]]))
    z = rms.normalize(np.array([[1.0, 20.0], [100.0, -100.0]]))
    assert z.dtype == np.float32
    np.testing.assert_allclose(z[0], [0.0, 0.0], atol=1e-4)
    np.testing.assert_array_equal(z[1], [3.0, -3.0])


def test_copy_is_independent():
    rms = RunningMeanStd(1)
    snapshot = rms.copy()
    rms.update(np.array([[5.0]]))
    np.testing.assert_array_equal(snapshot.mean, [0.0])
    assert snapshot.clip == rms.clip and snapshot.epsilon == rms.epsilon
