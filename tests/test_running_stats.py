"""mpi_util.SharedRunningStats and merge_moments: normalizer statistics merged over ranks, under a real mpiexec with
gymnasium's vector wrappers and SB3's RunningMeanStd (SB3 in the ranks only: the pytest process imports TensorFlow)."""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest
from conftest import mpiexec
from gymnasium.wrappers.utils import RunningMeanStd
from mpi4py import MPI

from mpi_util import SharedRunningStats, merge_moments


def moments_of(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    return x.mean(axis=0), x.var(axis=0), float(len(x))


def test_merged_moments_are_those_of_all_samples():
    rng = np.random.default_rng(0)
    shared = rng.normal(3.0, 2.0, size=(500, 4))
    added = [rng.normal(mu, 0.5, size=(n, 4)) for mu, n in ((3.5, 300), (-1.0, 20), (10.0, 1000), (0.0, 0))]
    mean, var, count = merge_moments(moments_of(shared), [moments_of(np.concatenate([shared, a])) for a in added])
    everything = np.concatenate([shared, *added])
    assert count == len(everything)
    np.testing.assert_allclose(mean, everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(var, everything.var(axis=0), rtol=1e-10)


def test_one_rank_keeps_its_statistics_bit_for_bit_in_their_types():
    observations, returns = RunningMeanStd(shape=(3,), dtype=np.float32), RunningMeanStd(shape=())
    shared = SharedRunningStats([observations, returns], comm=MPI.COMM_SELF)
    rng = np.random.default_rng(1)
    observations.update(rng.normal(size=(7, 3)).astype(np.float32))
    returns.update(rng.normal(size=5).astype(np.float32))  # as NormalizeReward feeds it: mean becomes a numpy scalar
    before = [(s.mean, s.var, s.count) for s in (observations, returns)]
    shared.merge()
    for stat, old in zip((observations, returns), before, strict=True):
        for new, value in zip((stat.mean, stat.var, stat.count), old, strict=True):
            assert type(new) is type(value) and np.asarray(new).dtype == np.asarray(value).dtype
            assert np.asarray(new).tobytes() == np.asarray(value).tobytes()
    assert isinstance(returns.mean, np.float64) and isinstance(returns.count, float)


def test_bad_statistics_get_one_line_saying_what_to_pass():
    with pytest.raises(TypeError, match=r"^SharedRunningStats: rank 0: statistic 1: a dict has no \.mean; pass "
                                        r"objects with \.mean, \.var and \.count"):
        SharedRunningStats([RunningMeanStd(), {"mean": 0.0}], comm=MPI.COMM_SELF)
    stat = RunningMeanStd(shape=(2,))
    shared = SharedRunningStats(stat, comm=MPI.COMM_SELF)
    stat.update(np.ones((4, 2)))
    shared.merge()
    stat.count = 1.0
    with pytest.raises(ValueError, match=r"^SharedRunningStats.merge: rank 0 statistic 0 counts 1 samples, fewer "
                                         r"than the 4.0001 every rank shared at the last merge"):
        shared.merge()


def same_bits(x: object, y: object) -> bool:
    return type(x) is type(y) and np.asarray(x).dtype == np.asarray(y).dtype and (
        np.asarray(x).tobytes() == np.asarray(y).tobytes())


@pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                    reason="stable-baselines3 not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("nprocs", [2, 3])
def test_merged_normalizers_equal_one_fed_every_ranks_samples_on_every_rank(tmp_path, nprocs):
    mpiexec(nprocs, "running_stats_cases.py", str(tmp_path), timeout=90)
    got = [pickle.loads((tmp_path / f"stats_{r}.pkl").read_bytes()) for r in range(nprocs)]
    # Statistics 0-1: InvertedPendulum's observations (float64) and returns; 2-3: Pendulum's (float32) and returns;
    # 4: SB3's RunningMeanStd fed normal samples. One RunningMeanStd fed every rank's batches, rank 0's first.
    references = [RunningMeanStd(shape=got[0]["rounds"][0]["after"][i][0].shape) for i in range(5)]
    for round_ in range(3):
        for i, reference in enumerate(references):
            for r in range(nprocs):
                for batch in got[r]["rounds"][round_]["fed"][i]:
                    reference.update(batch)  # as the rank fed it (a float32 batch has a float32 mean)
            mean, var, count = got[0]["rounds"][round_]["after"][i]
            rtol = 1e-4 if np.asarray(mean).dtype == np.float32 else 1e-10
            assert count == pytest.approx(reference.count, rel=1e-12), (round_, i)
            np.testing.assert_allclose(mean, reference.mean, rtol=rtol, atol=rtol, err_msg=f"{round_}, {i}")
            np.testing.assert_allclose(var, reference.var, rtol=rtol, err_msg=f"{round_}, {i}")
            for r in range(1, nprocs):
                assert all(same_bits(x, y) for x, y in zip(got[r]["rounds"][round_]["after"][i], (mean, var, count),
                                                           strict=True)), (round_, i, r)
    assert [len(got[r]["rounds"][0]["fed"][0]) for r in range(nprocs)] == [11 + 7 * r for r in range(nprocs)]
    final = got[0]["rounds"][-1]["after"]
    assert [np.asarray(final[i][0]).dtype for i in range(5)] == [np.float64, np.float64, np.float32, np.float64,
                                                                 np.float64]
    assert isinstance(final[1][0], np.float64) and all(type(final[i][2]) is float for i in range(5))
    last = nprocs - 1
    for r in range(nprocs):
        assert got[r]["in_sync"] == []
        assert got[r]["errors"] == {
            "shape": f"SharedRunningStats: rank {last} statistic 0 has mean float64[2] but rank 0 float64[3]; build "
                     "the same normalizers on every rank",
            "count": f"SharedRunningStats.merge: rank {last} statistic 4 counts 0.0001 samples, fewer than the "
                     f"{final[4][2]:g} every rank shared at the last merge: it was reset or replaced since; build a "
                     "new SharedRunningStats after replacing statistics",
        }
        assert got[r]["unchanged"]
