"""stable-baselines3 PPO with the work per iteration of train.py's defaults, the peer vs_sb3.py and peers.py measure:
one env under VecNormalize (clip 10), n_steps 2048, batch 64, 10 epochs, lr 3e-4, target_kl 0.02, torch on
``--torch_threads`` thread(s). ``--json PATH`` writes the per-iteration record peers.py reads (steps, wall_s,
t_rollout, t_update, grad_steps and the returns of the episodes that ended in the iteration).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

BATCH = 2048


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Walker2d-v5")
    parser.add_argument("--total_steps", type=int, default=61_440)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch_threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="where the per-iteration record goes")
    args = parser.parse_args()

    import gymnasium
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(args.torch_threads)
    marks: list[tuple[float, float, int]] = []  # per iteration: (rollout start, rollout end, Adam steps before it)
    episodes: list[tuple[int, float]] = []  # (steps so far, Monitor's raw return)
    grad_steps = [0]

    class Recorder(BaseCallback):
        def _on_rollout_start(self) -> None:
            marks.append((time.perf_counter(), 0.0, grad_steps[0]))

        def _on_rollout_end(self) -> None:
            marks[-1] = (marks[-1][0], time.perf_counter(), marks[-1][2])

        def _on_step(self) -> bool:
            episodes.extend((self.num_timesteps, float(info["episode"]["r"]))
                            for info in self.locals["infos"] if "episode" in info)
            return True

    env = VecNormalize(DummyVecEnv([lambda: Monitor(gymnasium.make(args.env))]), clip_obs=10.0, gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=BATCH, batch_size=64, n_epochs=10, learning_rate=3e-4, clip_range=0.2,
                gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5, ent_coef=0.0, vf_coef=0.5, target_kl=0.02,
                seed=args.seed, device="cpu", verbose=0)
    model.policy.optimizer.register_step_post_hook(lambda *_: grad_steps.__setitem__(0, grad_steps[0] + 1))
    started = time.perf_counter()
    model.learn(total_timesteps=args.total_steps, callback=Recorder())
    marks.append((time.perf_counter(), 0.0, grad_steps[0]))  # where the last update ends
    iterations = [{"steps": (k + 1) * BATCH, "wall_s": following[0] - started, "t_rollout": end - start,
                   "t_update": following[0] - end, "grad_steps": following[2] - before,
                   "returns": [r for steps, r in episodes if k * BATCH < steps <= (k + 1) * BATCH]}
                  for k, ((start, end, before), following) in enumerate(zip(marks[:-1], marks[1:], strict=True))]
    print(f"{len(iterations)} iterations in {marks[-1][0] - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"iterations": iterations, "torch_threads": torch.get_num_threads(),
                                         "versions": {"stable_baselines3": stable_baselines3.__version__,
                                                      "torch": torch.__version__}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
