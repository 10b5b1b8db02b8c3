"""Rank 0's PPO update alone, side by side with each speed lever turned off, or (--kernels) with each choice of
TensorFlow's kernels and threads per kind of network (benchmarks/README.md, section update.py).

--kernels NETWORK times the four choices of intra-op threads (1 or the CPUs) and TF_ENABLE_ONEDNN_OPTS (0 or 1) on
one kind of network, each on the work train.py gives it by default: walker2d (64x64 MLPs, 2,048 rows, 10 epochs of
64), minatar (the one-layer CNN of MinAtar's 10x10x4 boards, the same work) or pong (the Nature CNN on 84x84x4
frames, the Atari work: 1,024 rows, 4 epochs of 256); the image networks in the layout train.py builds for that game
(algos.registry.shares_torso: one torso for Pong, two CNNs for MinAtar), or as --torso says. With --precisions, an
image network instead runs in float32 and in bfloat16 (train.py's --precision), both at the kernels train.py chooses
for it.

Every variant runs in its own process: Walker2d-v5's ActorCritic, PPO with the default hyperparameters but
target_kl=None (every update runs all 10 epochs), one fixed batch of 2,048 random rows; two warm-up updates, then the
median of ``--updates`` timed ones, back to back. The levers (algos/ppo.py, algos/adam.py, the trainer's thread
settings), turned off one at a time by patching the learner in the child: keras_adam, unrolled (an epoch's minibatch
steps unrolled in the traced call, as before the graph loop), sliced (the graph loop's minibatches cut as
rows[start:start + size], of a shape unknown when traced, as before tf.slice), intra_all (intra-op threads = CPUs),
onednn_on.
Variants alternate in order from repeat to repeat; ratios pair runs of the same repeat. Writes runs.csv and results.md
to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from harness import fmt, load_average, median, options, table, write_results

LEVERS = ("keras_adam", "unrolled", "sliced", "intra_all", "onednn_on")
LABELS = {"keras_adam": "now, Keras Adam", "unrolled": "now, unrolled steps", "sliced": "now, loop of shapeless slices",
          "intra_all": "now, intra-op = CPUs", "onednn_on": "now, oneDNN on"}


def turn_off(lever: str) -> None:
    """Patch this checkout's learner (already imported) back to the formulation before ``lever``."""
    import keras

    import algos.ppo

    if lever == "keras_adam":
        class KerasAdam:
            def __init__(self, trained: list, learning_rate: float, epsilon: float = 1e-7) -> None:
                self.trained = trained
                self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate, epsilon=epsilon)
                self.optimizer.build(trained)
                self.learning_rate = self.optimizer._learning_rate

            def apply(self, grads: list) -> None:
                self.optimizer.apply_gradients(zip(grads, self.trained, strict=True))

        algos.ppo.FusedAdam = KerasAdam
    elif lever == "unrolled":
        def steps(self: Any, obs: Any, act: Any, adv: Any, v_target: Any, old_value: Any, old_logp: Any, rows: Any,
                  sums: Any) -> Any:
            mb = self.cfg.minibatch_size
            for start in range(0, int(rows.shape[0]), mb):
                sums += self._minibatch_step(obs, act, adv, v_target, old_value, old_logp, rows[start : start + mb])
            return sums

        algos.ppo.PPO._train_steps_fn = steps
    elif lever == "sliced":
        import tensorflow as tf

        def minibatch_loop(step: Any, rows: Any, minibatch_size: int, sums: Any) -> Any:
            count = tf.shape(rows)[0]

            def body(start: Any, sums: Any) -> tuple:
                return start + minibatch_size, sums + step(rows[start : start + minibatch_size])

            return tf.while_loop(lambda start, _: start < count, body, [tf.constant(0), sums], parallel_iterations=1)[1]

        algos.ppo.minibatch_loop = minibatch_loop


GAMES = {"minatar": "MinAtar/Breakout-v1", "pong": "ALE/Pong-v5"}
"""--kernels' image networks -> the game whose network train.py builds."""


def image_ppo(network: str, shared_torso: bool, precision: str) -> tuple[Any, tuple]:
    """PPO on an image ActorCritic with train.py's defaults for that env (``network``: minatar or pong, see --kernels)
    but target_kl=None, its CNN computing in ``precision``, seed 0, and the fixed batch of random images and actions it
    is timed on."""
    import keras
    import numpy as np

    from algos import PPO, ActorCritic, PPOConfig
    from algos.spaces import ActionSpec, ObsSpec

    keras.utils.set_random_seed(0)
    obs, actions = (ObsSpec((84, 84, 4), 1 / 255), 6) if network == "pong" else (ObsSpec((10, 10, 4)), 3)
    ac = ActorCritic(obs, ActionSpec((), (actions,)), hidden=(64, 64), shared_torso=shared_torso, precision=precision)
    rows, work = (1024, {"epochs": 4, "minibatch_size": 256}) if network == "pong" else (2048, {})
    ppo = PPO(ac, PPOConfig(target_kl=None, **work), seed=0)
    rng = np.random.default_rng(0)
    high = 256 if network == "pong" else 2
    batch = (rng.integers(0, high, (rows, *obs.shape), dtype=np.uint8), rng.integers(0, actions, rows),
             rng.normal(size=rows), rng.normal(size=rows))
    return ppo, batch


def walker2d_ppo() -> tuple[Any, tuple]:
    """PPO with the default hyperparameters but target_kl=None on Walker2d-v5's ActorCritic (17 observations, 6
    actions), seed 0, and the fixed batch it is timed on: (obs (2048, 17) float32, act (2048, 6) float32, adv (2048,),
    ret (2048,))."""
    import gymnasium
    import keras
    import numpy as np

    from algos import PPO, ActorCritic, PPOConfig

    keras.utils.set_random_seed(0)
    ac = ActorCritic(17, gymnasium.spaces.Box(-1.0, 1.0, (6,), np.float32), hidden=(64, 64))
    ppo = PPO(ac, PPOConfig(target_kl=None), seed=0)
    rng = np.random.default_rng(0)
    rows = 2048
    batch = (rng.normal(size=(rows, 17)).astype(np.float32), rng.normal(size=(rows, 6)).astype(np.float32),
             rng.normal(size=rows), rng.normal(size=rows))
    return ppo, batch


def child(intra_threads: int, lever: str, updates: int, network: str, shared_torso: bool, precision: str) -> None:
    """Time ``updates`` PPO updates, back to back; print {"t_update": [s, ...]} as JSON. TF_ENABLE_ONEDNN_OPTS is in
    the environment already; TensorFlow's threads are set as train.py sets them (inter-op min(2, CPUs), deterministic
    ops)."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra_threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, os.cpu_count() or 1))
    tf.config.experimental.enable_op_determinism()
    if lever not in ("", "intra_all", "onednn_on"):
        turn_off(lever)
    ppo, batch = walker2d_ppo() if network == "walker2d" else image_ppo(network, shared_torso, precision)
    for _ in range(2):
        ppo.update(*batch)
    times = []
    for _ in range(updates):
        start = time.perf_counter()
        ppo.update(*batch)
        times.append(time.perf_counter() - start)
    print(json.dumps({"t_update": times}))


def run_variant(name: str, lever: str, intra: int, onednn: str, args: argparse.Namespace,
                precision: str = "float32") -> dict[str, Any]:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn}
    load = load_average()
    result = subprocess.run(
        [sys.executable, __file__, "--child", "--intra", str(intra), "--lever", lever, "--updates", str(args.updates),
         "--kernels", args.kernels or "walker2d", *(["--torso", args.torso] if args.torso else []),
         "--precision", precision],
        capture_output=True, text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"update.py: {name} failed:\n{result.stderr[-3000:]}")
    times = json.loads(result.stdout.strip().splitlines()[-1])["t_update"]
    return {"variant": name, "t_update_s": median(times), "t_update_min_s": min(times), "intra_op_threads": intra,
            "onednn": onednn, "precision": precision, "load_before": load}


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "update", repeats=3)
    parser.add_argument("--updates", type=int, default=10, help="timed updates per run (default: %(default)s)")
    parser.add_argument("--levers", default=",".join(LEVERS),
                        help="comma-separated levers to turn off one at a time, or '' (default: all)")
    parser.add_argument("--kernels", choices=("walker2d", "minatar", "pong"),
                        help="time the kernel choices (threads x oneDNN) on this kind of network instead of the levers")
    parser.add_argument("--torso", choices=("shared", "separate"),
                        help="with --kernels minatar or pong: one CNN torso under both heads, or two CNNs (default: "
                             "the layout train.py builds for that game)")
    parser.add_argument("--precisions", action="store_true",
                        help="with --kernels minatar or pong: time the CNN in float32 and in bfloat16 (train.py's "
                             "--precision), each at the kernels train.py chooses for that network")
    parser.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--intra", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--lever", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torso is None and args.kernels in GAMES:
        from algos.registry import shares_torso

        args.torso = "shared" if shares_torso("ppo", GAMES[args.kernels], True) else "separate"
    return args


def main() -> int:
    args = parse_args()
    if args.child:
        child(args.intra, args.lever, args.updates, args.kernels, args.torso == "shared", args.precision)
        return 0
    levers = [lever for lever in args.levers.split(",") if lever]
    unknown = sorted(set(levers) - set(LEVERS))
    if unknown:
        raise SystemExit(f"update.py: error: unknown lever(s) {unknown}; choose from {', '.join(LEVERS)}")
    started = time.monotonic()
    runs = []
    cpus = os.cpu_count() or 1
    # Variants: (name, lever turned off, intra-op threads, TF_ENABLE_ONEDNN_OPTS, precision)
    if args.precisions:
        if args.kernels not in ("minatar", "pong"):
            raise SystemExit("update.py: error: --precisions needs --kernels minatar or pong")
        from trainer.kernels import rank0_tensorflow_kernels

        chosen = rank0_tensorflow_kernels({"minatar": "small_cnn", "pong": "nature_cnn"}[args.kernels], cpus, 0, 1)
        intra, onednn = chosen["tf_intra_op_threads"], str(chosen["tf_enable_onednn_opts"])
        variants = [("now", "", intra, onednn, "float32"), ("bfloat16", "", intra, onednn, "bfloat16")]
    elif args.kernels:
        variants = [("now" if (intra, onednn) == (1, "0") else f"{intra} thread(s), oneDNN {onednn}", "", intra, onednn,
                     "float32") for intra in (1, cpus) for onednn in ("0", "1")]
    else:
        variants = [("now", "", 1, "0", "float32")] + [
            (LABELS[lever], lever, cpus if lever == "intra_all" else 1, "1" if lever == "onednn_on" else "0",
             "float32") for lever in levers]
    for repeat in range(args.repeats):
        for name, lever, intra, onednn, precision in variants if repeat % 2 == 0 else variants[::-1]:
            run = {**run_variant(name, lever, intra, onednn, args, precision), "repeat": repeat}
            runs.append(run)
            print(f"repeat {repeat} {name}: t_update {run['t_update_s'] * 1000:.1f} ms", flush=True)
    for run in runs:
        now = next(r for r in runs if r["repeat"] == run["repeat"] and r["variant"] == "now")
        run["ratio_to_now"] = run["t_update_s"] / now["t_update_s"]
    rows = []
    for name, *_ in variants:
        mine = [r for r in runs if r["variant"] == name]
        rows.append([name, mine[0]["intra_op_threads"], mine[0]["onednn"], mine[0]["precision"],
                     fmt(median([r["t_update_s"] for r in mine]) * 1000, 1),
                     ", ".join(f"{r['ratio_to_now']:.2f}" for r in mine)])
    text = table(["variant", "intra-op threads", "TF_ENABLE_ONEDNN_OPTS", "precision", "t_update (ms, median)",
                  "t_update / now (per repeat)"], rows)
    work = ("a fixed 1,024-row batch, 4 epochs x 4 minibatches of 256" if args.kernels == "pong"
            else "a fixed 2,048-row batch, 10 epochs x 32 minibatches")
    network = {None: "Walker2d's ActorCritic", "walker2d": "Walker2d's ActorCritic",
               "minatar": f"MinAtar's CNN ActorCritic ({args.torso} torso)",
               "pong": f"the Nature CNN ActorCritic on 84x84x4 ({args.torso} torso)"}[args.kernels]
    about = (f"- each run: PPO update of {network} on {work}, target_kl off; median of {args.updates} updates after 2 "
             f"warm-up ones, back to back; {args.repeats} interleaved repeats")
    loads = ", ".join(f"r{r['repeat']} {r['variant']}: {r['load_before']:.2f}" for r in runs)
    write_results(args.out, runs, text, time.monotonic() - started, loads, [about])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
