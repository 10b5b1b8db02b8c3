"""stable-baselines3 PPO with the work per iteration of train.py's defaults, the peer peers.py measures: one env under
VecNormalize (clip 10), n_steps 2048, batch 64, 10 epochs, lr 3e-4, target_kl 0.02, torch on ``--torch_threads``
thread(s); --batch_size, --epochs, --minibatch_size and --lr change the work as train.py's options of those names do.
An image env gets train.py's network for PPO instead: train.py's CNN (algos.spaces.conv_layers), one torso under
the policy and value heads where train.py shares it (an Atari id; algos.registry.shares_torso), two CNNs otherwise,
rewards normalized, pixels scaled to [0, 1]; an Atari id SB3's own Atari preprocessing
(noop reset, frame skip 4, 84x84 grey, a lost life ends the episode for learning, clipped rewards, and FIRE at reset,
which train.py does not press) with 4 stacked frames, and train.py's Atari settings (algos.registry): 8 envs sharing
the batch, clip range and learning rate decayed linearly to 0, entropy 0.01, no KL early stop. ``--json PATH`` writes
the per-iteration record peers.py reads
(steps, wall_s, t_rollout, t_update, grad_steps and the returns of the episodes that ended in the iteration).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Walker2d-v5")
    parser.add_argument("--total_steps", type=int, default=61_440)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch_threads", type=int, default=1)
    for name, default in (("batch_size", 2048), ("epochs", 10), ("minibatch_size", 64), ("lr", 3e-4)):
        parser.add_argument(f"--{name}", type=type(default), default=default, help="as train.py's option")
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

    from algos.registry import ALGORITHMS, ENVS_IN_ALL, shares_torso
    from algos.spaces import conv_layers
    from envs.make import env_family, register_namespace

    register_namespace(args.env)
    atari = ALGORITHMS["ppo"].defaults_for(env_family(args.env))  # the generic settings where not Atari
    n_envs = atari.get(ENVS_IN_ALL, 1)
    if env_family(args.env) == "atari":
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        base = VecFrameStack(make_atari_env(args.env, n_envs, args.seed, env_kwargs={"frameskip": 1}), n_stack=4)
    else:
        base = DummyVecEnv([lambda: Monitor(gymnasium.make(args.env))])
    image = len(base.observation_space.shape) == 3
    env = VecNormalize(base, norm_obs=not image, clip_obs=10.0, gamma=0.99)
    policy_kwargs = {}
    if image:
        policy_kwargs = {"features_extractor_class": _torso_class(conv_layers),
                         "share_features_extractor": shares_torso("ppo", args.env, True),
                         "net_arch": []}
    clip = atari["clip_ratio"]
    schedule = atari["clip_schedule"] == "linear"
    model = PPO("CnnPolicy" if image else "MlpPolicy", env, policy_kwargs=policy_kwargs,
                n_steps=args.batch_size // n_envs, batch_size=args.minibatch_size, n_epochs=args.epochs,
                learning_rate=(lambda left: args.lr * left) if schedule else args.lr,
                clip_range=(lambda left: clip * left) if schedule else clip, gamma=0.99, gae_lambda=0.95,
                max_grad_norm=0.5, ent_coef=atari["ent_coef"], vf_coef=atari["vf_coef"],
                target_kl=atari["kl_targ"] or None, seed=args.seed, device="cpu", verbose=0)
    model.policy.optimizer.register_step_post_hook(lambda *_: grad_steps.__setitem__(0, grad_steps[0] + 1))
    started = time.perf_counter()
    model.learn(total_timesteps=args.total_steps, callback=Recorder())
    marks.append((time.perf_counter(), 0.0, grad_steps[0]))  # where the last update ends
    batch = args.batch_size
    iterations = [{"steps": (k + 1) * batch, "wall_s": following[0] - started, "t_rollout": end - start,
                   "t_update": following[0] - end, "grad_steps": following[2] - before,
                   "returns": [r for steps, r in episodes if k * batch < steps <= (k + 1) * batch]}
                  for k, ((start, end, before), following) in enumerate(zip(marks[:-1], marks[1:], strict=True))]
    print(f"{len(iterations)} iterations in {marks[-1][0] - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"iterations": iterations, "torch_threads": torch.get_num_threads(),
                                         "versions": {"stable_baselines3": stable_baselines3.__version__,
                                                      "torch": torch.__version__}}))
    return 0


def _torso_class(conv_layers: Any) -> type:
    """An SB3 features extractor of train.py's image torso: (N, H, W, C) observations (or, after SB3's transpose of
    uint8 images, (N, C, H, W)) scaled to [0, 1], conv_layers' ReLU convolutions, a ReLU dense layer."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class Torso(BaseFeaturesExtractor):
        def __init__(self, space: Any) -> None:
            self.channels_first = space.shape[0] < space.shape[-1]  # SB3 moved the channels of uint8 images first
            height, width, channels = space.shape[1:] + space.shape[:1] if self.channels_first else space.shape
            convs, dense = conv_layers((height, width, channels))
            super().__init__(space, dense)
            self.scale = 1.0 / float(space.high.max())
            layers: list[torch.nn.Module] = []
            for filters, kernel, stride in convs:
                layers += [torch.nn.Conv2d(channels, filters, kernel, stride), torch.nn.ReLU()]
                channels, height, width = filters, (height - kernel) // stride + 1, (width - kernel) // stride + 1
            self.net = torch.nn.Sequential(*layers, torch.nn.Flatten(),
                                           torch.nn.Linear(channels * height * width, dense), torch.nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            x = observations.float() * self.scale
            return self.net(x if self.channels_first else x.permute(0, 3, 1, 2))

    return Torso


if __name__ == "__main__":
    raise SystemExit(main())
