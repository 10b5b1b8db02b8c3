"""rank0_accum_batches, rank0_bcast_wts, all_sum / all_mean and seeds under a real mpiexec at 1, 2 and 3 ranks,
compared with the answer computed sequentially."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import SCRIPTS, launcher, run_bounded

from mpi_util import rank_seed
from mpi_util.launch import mpi_library_is_open_mpi
from mpi_util.wakeup import doorbell_supported

SIZES = [1, 2, 3]


def load(path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize(("nprocs", "wait"), [(n, "") for n in SIZES] + [(3, "poll")])
def test_gather_equals_concatenation_in_rank_order(run_mpi, tmp_path, nprocs, wait):
    # wait "poll": the timed polling that collectives fall back to where the doorbell cannot be used.
    run_mpi(nprocs, "gather_cases.py", str(tmp_path), env={"MPI_UTIL_WAIT": wait})
    routes = check_gather(tmp_path, nprocs)
    # On one host with the doorbell, batches within the limit go through the shared-memory segments once they have
    # grown to hold them (the first gather of a new size grows them); never when polling (no doorbell).
    shared = [case for case, route in routes.items() if route == "shared"]
    if nprocs > 1 and not wait and doorbell_supported():
        assert {"all_zero_rows", "medium_again", *(f"race_{k}" for k in range(6))} <= set(shared)
        assert routes["large"] == "mpi" and routes["medium"] == "mpi"
    elif nprocs > 1:
        assert shared == []


# Under Open MPI a window one rank cannot create (ftruncate: File too large) leaves the other ranks waiting inside
# Allocate_shared (seen with 5.0.11: the job hung until killed); there only room_for's check before allocating helps.
REFUSAL_HANGS = pytest.mark.skipif(mpi_library_is_open_mpi(), reason="Open MPI hangs in a refused Allocate_shared")


@REFUSAL_HANGS
def test_gather_falls_back_to_mpi_when_shared_memory_is_refused(run_mpi, tmp_path):
    run_mpi(3, "gather_cases.py", str(tmp_path), env={"GATHER_FILE_LIMIT": "100000"})
    routes = check_gather(tmp_path, 3)
    assert set(routes.values()) == {"mpi"}
    if doorbell_supported():
        assert [json.loads((tmp_path / f"refused_{r}.json").read_text()) for r in range(3)] == [True] * 3


def can_mount_private_dev_shm() -> bool:
    """Whether this test may give a job its own small /dev/shm: root, and ``unshare -m`` works here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize(("dev_shm_size", "shared"), [("24m", False), ("64m", True)])
def test_small_dev_shm_falls_back_to_mpi_instead_of_sigbus(tmp_path, dev_shm_size, shared):
    # tmpfs hands out pages on first write: before the room check, a 24 MB /dev/shm let the 15 MiB broadcast window
    # be allocated and then killed the job with SIGBUS (exit 7). 64 MB (what a container gets by default) has room.
    if not can_mount_private_dev_shm():
        pytest.skip("needs root and `unshare -m` to give the job a small private /dev/shm")
    command, env = launcher("-n", "2", sys.executable, "-u", str(SCRIPTS / "shm_room.py"), str(tmp_path))
    result = run_bounded(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={dev_shm_size} tmpfs /dev/shm && "
                          f"exec {shlex.join(command)}"], 120, env)
    assert result.returncode == 0, result.stderr[-3000:]
    for r in range(2):
        assert json.loads((tmp_path / f"shm_room_{r}.json").read_text()) == {
            "bcast_fell_back": not shared, "gather_fell_back": not shared,
            "gathers_through_shared_memory": 2 if shared else 0,
        }, r


def check_gather(tmp_path, nprocs) -> dict[str, str]:
    """Check every case gather_cases.py saved: rank 0 got the concatenation, the others their own batch back; the
    routes (shared memory or MPI) each case took, the same on every rank."""
    routes = json.loads((tmp_path / "routes_0.json").read_text())
    for r in range(1, nprocs):
        assert json.loads((tmp_path / f"routes_{r}.json").read_text()) == routes, r
    for case in routes:
        inputs = [load(tmp_path / f"{case}_in_{r}.npz") for r in range(nprocs)]
        gathered = load(tmp_path / f"{case}_out_0.npz")
        assert list(gathered) == list(inputs[0])
        for key in inputs[0]:
            expected = np.concatenate([inp[key] for inp in inputs])
            assert gathered[key].dtype == expected.dtype, (case, key)
            assert gathered[key].shape == expected.shape, (case, key)
            assert gathered[key].tobytes() == expected.tobytes(), (case, key)
        for r in range(1, nprocs):  # other ranks get their own batch back
            returned = load(tmp_path / f"{case}_out_{r}.npz")
            for key in inputs[r]:
                assert returned[key].tobytes() == inputs[r][key].tobytes(), (case, key, r)
    return routes


@pytest.mark.parametrize(("nprocs", "wait"), [(2, ""), (3, ""), (8, ""), (3, "poll")])
def test_exchange_rounds_back_to_back_see_every_rank_values(run_mpi, tmp_path, nprocs, wait):
    # On one host the exchange goes through the doorbell's slots, two sets used in turn; with one set, ranks running
    # ahead overwrote values others had not read in about half of 3,000 rounds at 3 ranks.
    run_mpi(nprocs, "exchange_stress.py", str(tmp_path), "2000", env={"MPI_UTIL_WAIT": wait})
    for r in range(nprocs):
        result = json.loads((tmp_path / f"exchange_{r}.json").read_text())
        assert result == {"wrong": 0, "on_host": doorbell_supported() and not wait}, r


@pytest.mark.skipif(not doorbell_supported(), reason="the doorbell needs Linux futexes on x86-64 or aarch64")
@pytest.mark.parametrize("nprocs", [3, 8])
def test_doorbell_counts_every_ring_and_loses_no_wake_up(run_mpi, tmp_path, nprocs):
    # With a plain load and store for the ring (the mutation), 8 ranks lost about 470 of 24,000 rings.
    run_mpi(nprocs, "doorbell_stress.py", str(tmp_path), "3000", "5")
    results = [json.loads((tmp_path / f"doorbell_{r}.json").read_text()) for r in range(nprocs)]
    for r, result in enumerate(results):
        assert result["bell"] == result["rings"] == 3000 * nprocs, f"rank {r}: rings were lost: {result}"
        assert result["timed_out_sleeps"] == 0, f"rank {r} slept through a ring until its 5 s timeout: {result}"


@pytest.mark.parametrize(("nprocs", "wait"), [(n, "") for n in SIZES] + [(3, "poll")])
def test_bcast_numpy_is_bit_exact(run_mpi, tmp_path, nprocs, wait):
    run_mpi(nprocs, "bcast_cases.py", str(tmp_path), env={"MPI_UTIL_WAIT": wait})
    check_bcast(tmp_path, nprocs, ["numpy_list", "large", "larger"])


@pytest.mark.skipif(not doorbell_supported(), reason="broadcasts go through shared memory only with the doorbell")
@REFUSAL_HANGS
def test_bcast_falls_back_to_mpi_when_shared_memory_is_refused(run_mpi, tmp_path):
    # Files over 100 kB cannot be written during the broadcasts: the window for "large" (1.2 MB) is refused.
    run_mpi(3, "bcast_cases.py", str(tmp_path), env={"BCAST_FILE_LIMIT": "100000"})
    check_bcast(tmp_path, 3, ["numpy_list", "large", "larger"])
    assert all(json.loads((tmp_path / f"host_bcast_{r}.json").read_text())["fell_back"] for r in range(3))
    run_mpi(3, "bcast_cases.py", str(tmp_path))  # without the limit the window serves every case
    assert not any(json.loads((tmp_path / f"host_bcast_{r}.json").read_text())["fell_back"] for r in range(3))


def test_bcast_keras_tf_module_variables_bit_exact_after_setup_gpu_says_once_that_there_is_no_gpu(run_mpi, tmp_path):
    # One size: what depends on the number of ranks is the numpy broadcast below the TensorFlow objects, which
    # test_bcast_numpy_is_bit_exact runs at every size; each rank of this job imports TensorFlow (about 5 CPU-s), so
    # the same job also calls setup_gpu(0.08) as a TensorFlow script begins.
    nprocs = 2
    result = run_mpi(nprocs, "bcast_cases.py", str(tmp_path), "tf", timeout=180)
    check_bcast(tmp_path, nprocs, ["numpy_list", "large", "larger", "keras_model", "tf_module", "tf_variables",
                                   "mixed_list"])
    if "GPU_COUNT 0" in result.stdout:  # with a GPU, setup_gpu has a GPU to set up and says what it did
        # "once": rank 0 says it, the other rank not
        assert result.stdout.count("no GPU visible to TensorFlow; gpu_pct=0.08 has no effect") == 1, result.stdout
        assert result.stdout.count("SETUP {'gpu': None, 'memory_limit_mb': None}") == nprocs, result.stdout
    else:
        assert "GPU_COUNT" in result.stdout, result.stdout


def test_bcast_torch_module_with_a_0d_buffer(run_mpi, tmp_path):
    # BatchNorm's num_batches_tracked is a 0-d tensor: read as a (1,) array (np.ascontiguousarray), it failed to copy
    # back ("output with shape [] doesn't match the broadcast shape [1]") and the job died.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed (pip install -e '.[test]')")
    run_mpi(2, "bcast_cases.py", str(tmp_path), "torch", timeout=120)
    check_bcast(tmp_path, 2, ["numpy_list", "torch_module"])


def check_bcast(tmp_path, nprocs: int, cases: list[str]) -> None:
    for case in cases:
        source = list(load(tmp_path / f"{case}_before_0.npz").values())
        if nprocs > 1:  # the ranks really started different, so the test can fail
            other = list(load(tmp_path / f"{case}_before_1.npz").values())
            assert any(a.tobytes() != b.tobytes() for a, b in zip(source, other, strict=True) if a.size), case
        for r in range(nprocs):
            after = list(load(tmp_path / f"{case}_after_{r}.npz").values())
            assert len(after) == len(source)
            for a, b in zip(after, source, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape, case
                assert a.tobytes() == b.tobytes(), (case, r)


@pytest.mark.parametrize("nprocs", SIZES)
def test_all_sum_all_mean_match_sequential(run_mpi, tmp_path, nprocs):
    run_mpi(nprocs, "reductions.py", str(tmp_path))
    per_rank = [load(tmp_path / f"reductions_{r}.npz") for r in range(nprocs)]
    for dtype in ("float16", "float32", "float64", "int8", "int32", "int64", "uint16", "bool", "complex128"):
        if dtype == "bool":
            inputs = [(np.arange(6).reshape(2, 3) % (r + 2)) == 0 for r in range(nprocs)]
            expected_sum = np.sum(inputs, axis=0, dtype=np.int64)
        else:
            inputs = [(np.arange(6).reshape(2, 3) + r).astype(dtype) for r in range(nprocs)]
            expected_sum = np.sum(inputs, axis=0).astype(dtype)
        mean_dtype = np.float64 if np.dtype(inputs[0].dtype).kind in "biu" else inputs[0].dtype
        expected_mean = (np.sum(np.array(inputs, dtype=mean_dtype), axis=0) / nprocs).astype(mean_dtype)
        for r in range(nprocs):
            assert per_rank[r][f"sum_{dtype}"].dtype == expected_sum.dtype, dtype
            np.testing.assert_array_equal(per_rank[r][f"sum_{dtype}"], expected_sum)
            assert per_rank[r][f"mean_{dtype}"].dtype == expected_mean.dtype, dtype
            np.testing.assert_allclose(per_rank[r][f"mean_{dtype}"], expected_mean, rtol=1e-3)
    for r in range(nprocs):
        assert per_rank[r]["sum_scalar_int"] == nprocs * (nprocs + 1) // 2
        assert per_rank[r]["sum_scalar_float"] == 0.5 * sum(range(nprocs))
        assert per_rank[r]["mean_scalar"] == pytest.approx(sum(range(nprocs)) / nprocs)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_seeds_differ_per_rank_and_follow_rank_seed(run_mpi, tmp_path, nprocs):
    run_mpi(nprocs, "seeds.py", str(tmp_path), "123")
    per_rank = [load(tmp_path / f"seed_{r}.npz") for r in range(nprocs)]
    assert [int(p["seed"]) for p in per_rank] == [rank_seed(123, r) for r in range(nprocs)]
    draws = {p["numpy_draw"].tobytes() for p in per_rank}
    assert len(draws) == nprocs
    for r, p in enumerate(per_rank):
        np.testing.assert_array_equal(p["numpy_draw"], np.random.RandomState(rank_seed(123, r)).random_sample(3))


def test_rank_seed_independent_of_world_size():
    spawned = np.random.SeedSequence(5).spawn(4)
    assert [rank_seed(5, r) for r in range(4)] == [int(s.generate_state(1)[0]) for s in spawned]
    assert len({rank_seed(5, r) for r in range(64)}) == 64
    with pytest.raises(ValueError, match="non-negative"):
        rank_seed(-1, 0)


@pytest.mark.parametrize("nprocs", SIZES)
def test_shared_budget_hands_out_exactly_its_total(run_mpi, tmp_path, nprocs):
    run_mpi(nprocs, "budget_cases.py", str(tmp_path))
    per_rank = [load(tmp_path / f"budget_{r}.npz") for r in range(nprocs)]
    for round_index, total in enumerate([100_000, 1000, 1, 0]):
        handed_out = 0
        for saved in per_rank:
            asked, got = saved[f"asked_{round_index}"], saved[f"got_{round_index}"]
            assert np.all((0 <= got) & (got <= asked))
            # Each rank takes until a take comes back short; after that every take gets nothing.
            assert np.all(got[:-2] == asked[:-2]) and got[-2] < asked[-2] and got[-1] == 0
            handed_out += int(got.sum())
        assert handed_out == total, round_index
    if nprocs > 1:  # the ranks really shared the unit-by-unit round
        assert all(int(saved["got_0"].sum()) > 0 for saved in per_rank)
    # Rank 0 refilled the 1000 after round 1; every rank takes from that refill at the end.
    assert sum(int(saved["after_refill"][0]) for saved in per_rank) == 1000


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize(
    ("wait", "rank0_late"),
    [("doorbell", "before_exchange"), ("poll", "before_exchange"), ("doorbell", "before_data")],
)
def test_waiting_rank_does_not_spin(run_mpi, tmp_path, nprocs, wait, rank0_late):
    """Rank 0 is late 2 s, either before a collective (its update) or between the exchange where the ranks meet and
    the data round (descheduled on a loaded machine). Only the doorbell sleeps through the second: without it the
    data round is a busy Waitall, as MPICH's blocking collectives are."""
    if wait == "doorbell" and not doorbell_supported():
        pytest.skip("the doorbell needs Linux futexes on x86-64 or aarch64")
    late_data = ["late_data"] if rank0_late == "before_data" else []
    run_mpi(nprocs, "waiting_cpu.py", "2.0", str(tmp_path), *late_data, env={"MPI_UTIL_WAIT": wait})
    for r in range(1, nprocs):
        report = json.loads((tmp_path / f"cpu_{r}.json").read_text())
        assert report.pop("doorbell") == (wait == "doorbell"), report
        assert len(report) == (2 if late_data else 3), report
        for waited in report.values():
            assert waited["wall_s"] > 1.5, report  # it really waited for rank 0
            # A busy-polling wait would burn ~2 s of CPU here; the timed poll (a wake-up every millisecond) burns
            # about 40 ms, the doorbell (asleep until rung, a wake-up every 0.25 s) under 5 ms. Once every rank has
            # posted the data round, ranks complete it with a busy Waitall by design; if the machine deschedules
            # rank 0 then (CI saw 44 ms), the others spin that long. So the CPU allowed grows by the time the call
            # took beyond rank 0's 2 s away, which a rank spinning while rank 0 is away could never stay under.
            late_beyond_rank0_work_s = max(0.0, waited["wall_s"] - 2.0)
            assert waited["cpu_s"] < (0.02 if wait == "doorbell" else 0.3) + late_beyond_rank0_work_s, report


def test_gathered_batch_equals_sequential_rollouts_of_each_rank(run_mpi, tmp_path):
    env_ids = ["CartPole-v1", "Pendulum-v1"]  # a discrete and a continuous action space, in one job
    run_mpi(2, "rollout_gather.py", str(tmp_path), *env_ids, timeout=180)
    for env_id in env_ids:
        saved = load(tmp_path / f"rollouts_{env_id}.npz")
        for key in ("obs", "act", "adv", "ret"):
            gathered, sequential = saved[f"gathered_{key}"], saved[f"sequential_{key}"]
            assert gathered.shape[0] == 2 * 600
            assert gathered.tobytes() == sequential.tobytes(), (env_id, key)


@pytest.mark.parametrize("nprocs", SIZES)
def test_object_collectives_and_sync_check(run_mpi, tmp_path, nprocs):
    import pickle

    run_mpi(nprocs, "object_cases.py", str(tmp_path))
    got = [pickle.loads((tmp_path / f"objects_{r}.pkl").read_bytes()) for r in range(nprocs)]
    assert got[0]["gathered"] == [{"rank": r, "items": list(range(100 * r)), "name": f"r{r}"} for r in range(nprocs)]
    assert [a.tolist() for a in got[0]["gathered_large"]] == [[float(r)] * (3 << 18) for r in range(nprocs)]
    assert got[0]["gathered_none"] == [None] * nprocs
    for r in range(nprocs):
        if r:
            assert got[r]["gathered"] is None and got[r]["gathered_large"] is None
        assert got[r]["bcast"] == {"config": [1, 2.5, "x"], "from": 0}
        np.testing.assert_array_equal(got[r]["bcast_large"], np.arange(5 << 20, dtype=np.float32))
        assert got[r]["in_sync"] == []
        assert got[r]["one_rank_off"] == ([nprocs - 1] if nprocs > 1 else [])


def test_bcast_tree_returns_rank0_values_in_each_rank_structure(run_mpi, tmp_path):
    # With JAX installed, the same job also broadcasts JAX arrays, an optax Adam state and a registered dataclass.
    with_jax = ["jax"] if importlib.util.find_spec("jax") and importlib.util.find_spec("optax") else []
    run_mpi(3, "tree_cases.py", str(tmp_path), *with_jax, timeout=120)
    got = [json.loads((tmp_path / f"tree_{r}.json").read_text()) for r in range(3)]
    for case in ["numpy"] + (["jax"] if with_jax else []):
        assert got[1][case]["before"] != got[0][case]["before"], case  # the ranks really started different
        # A JAX array comes back a numpy array of the same dtype, shape and bytes.
        source = [str(entry).replace("'ArrayImpl'", "'ndarray'") for entry in got[0][case]["before"]]
        for r in range(3):
            # Same containers, leaf types, dtypes, shapes and bytes as rank 0's input; each rank keeps its own dict
            # insertion order; the input is left as it was.
            after = got[r][case]["after"]
            assert sorted(map(str, after)) == sorted(source), (case, r)
            assert got[r][case]["input_after"] == got[r][case]["before"], (case, r)
            if case == "numpy":
                assert [e[0] for e in after] == [e[0] for e in got[r][case]["before"]], r
    for r in range(3):
        assert got[r]["zero_d_in_place"] == [0.25, 0], r
        assert got[r]["alive"] == 3
    fragments = {
        "key": "rank 2 has leaf tree['b'] where rank 0 has tree['a']",
        "shape": "rank 2 leaf tree['opt'].mu[0] is float64[2, 3] but rank 0 has float64[3, 2]",
        "container": "rank 2 has tree['layers']: tuple where rank 0 has tree['layers']: list",
        "count": "rank 2 has leaf tree[2], which rank 0 has not (3 leaves against 2)",
    }
    for case, fragment in fragments.items():
        messages = {got[r]["errors"][case] for r in range(3)}
        assert len(messages) == 1, messages  # the same error on every rank
        message = messages.pop()
        assert message.startswith("WeightMismatchError: rank0_bcast_tree: ") and fragment in message, message
        assert message.endswith("build the same tree on every rank") and "\n" not in message, message
