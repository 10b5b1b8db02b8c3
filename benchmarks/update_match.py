"""One Atari PPO gradient of train.py against the CleanRL-style peer's, from the same weights and the same batch.

The torch process builds the peer's network (peer_cleanrl_atari.Agent) from --seed, draws a batch of N rows (uint8
84x84x4 frames, actions, advantages and returns; old log-probabilities and values from the network, as a rollout
records them) and computes the gradient of one minibatch of all N rows with the peer's loss (its lines, copied:
per-minibatch advantage normalization, clipped surrogate, clipped value loss at 0.5 x the squared error, entropy
bonus, global-norm clip). A TensorFlow process (a separate one: TensorFlow and torch in one process can abort) loads
those weights into train.py's ActorCritic and runs algos.ppo's own update with a learning rate of 0, one epoch, one
minibatch of N rows: its Adam's first moment is then (1 - beta_1) x the clipped gradient it applied. The table
compares the two per variable, and the unclipped gradient's policy and value parts.

    python benchmarks/update_match.py --out benchmarks/results/update_match

Known differences, named in the output: train.py weighs the value loss --vf_coef x the mean squared error (the peer
0.5 x --vf_coef x it), normalizes advantages over the batch (the peer per minibatch: the same here, one minibatch of
all rows, but numpy's standard deviation divides by N and torch's by N - 1), and does not clip the value loss (at
the first step of an update the peer's clipped and unclipped value losses are equal).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from harness import load_average, machine_lines

REPO = Path(__file__).resolve().parent.parent
OBS_SHAPE = (84, 84, 4)
N_ACTIONS = 4  # Breakout's minimal action set
CLIP, ENT_COEF, MAX_GRAD_NORM, LR = 0.1, 0.01, 0.5, 2.5e-4


def torch_stage(seed: int, rows: int, vf_coef: float, out: Path) -> None:
    """The peer's side: its network and batch to ``out`` (npz), with its clipped gradient and the parts' norms."""
    import torch
    from peer_cleanrl_atari import Agent  # beside this script, which Python puts first on sys.path
    from torch import nn

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    agent = Agent(OBS_SHAPE, N_ACTIONS)
    obs = rng.integers(0, 256, (rows, *OBS_SHAPE), dtype=np.uint8)
    act = rng.integers(0, N_ACTIONS, rows)
    adv = rng.normal(size=rows).astype(np.float32)
    ret = rng.normal(size=rows).astype(np.float32)
    b_obs, b_act = torch.as_tensor(obs), torch.as_tensor(act)
    b_adv, b_ret = torch.as_tensor(adv), torch.as_tensor(ret)
    with torch.no_grad():
        _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_act)
        b_values = b_values.view(-1)

    def loss_parts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # peer_cleanrl_atari.main's minibatch loss, all rows one minibatch.
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, b_act)
        ratio = (newlogprob - b_logprobs).exp()
        mb_advantages = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
        pg_loss = torch.max(-mb_advantages * ratio, -mb_advantages * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
        newvalue = newvalue.view(-1)
        v_unclipped = (newvalue - b_ret) ** 2
        v_clipped = b_values + torch.clamp(newvalue - b_values, -CLIP, CLIP)
        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_ret) ** 2).mean()
        return pg_loss - ENT_COEF * entropy.mean(), v_loss * vf_coef, entropy.mean()

    params = list(agent.parameters())
    policy_part, value_part, _ = loss_parts()
    policy_grads = torch.autograd.grad(policy_part, params, allow_unused=True, retain_graph=True)
    value_grads = torch.autograd.grad(value_part, params, allow_unused=True)

    def norm(grads: tuple) -> float:
        return float(torch.sqrt(sum((g**2).sum() for g in grads if g is not None)))

    agent.zero_grad()
    policy_part, value_part, _ = loss_parts()
    (policy_part + value_part).backward()
    total_norm = float(nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
    named = dict(agent.named_parameters())
    np.savez(out, obs=obs, act=act, adv=adv, ret=ret, total_norm=total_norm, policy_norm=norm(policy_grads),
             value_norm=norm(value_grads), **{f"w/{k}": v.detach().numpy() for k, v in named.items()},
             **{f"g/{k}": v.grad.numpy() for k, v in named.items()})


def to_keras(name: str, array: np.ndarray, flat_chw: tuple[int, int, int]) -> np.ndarray:
    """A torch parameter as the Keras variable of the same layer: conv (out, in, kh, kw) -> (kh, kw, in, out); the
    dense layer after the flatten reorders its inputs from (C, H, W) to Keras's (H, W, C); linear (out, in) -> (in,
    out); biases as they are."""
    if array.ndim == 4:
        return array.transpose(2, 3, 1, 0)
    if array.ndim == 2 and array.shape[1] == int(np.prod(flat_chw)):
        c, h, w = flat_chw
        return array.reshape(array.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, array.shape[0])
    return array.T if array.ndim == 2 else array


# The peer's parameters in the order of ActorCritic.variables() for a shared torso: the torso's layers, then the
# policy head's, then the value head's.
PEER_ORDER = ["network.0.0.weight", "network.0.0.bias", "network.0.2.weight", "network.0.2.bias", "network.0.4.weight",
              "network.0.4.bias", "network.1.weight", "network.1.bias", "actor.weight", "actor.bias", "critic.weight",
              "critic.bias"]


def tf_stage(npz: Path, vf_coef: float, out: Path) -> None:
    """train.py's side: its update at lr 0 from the peer's weights; its applied (clipped) gradient per variable."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import gymnasium

    from algos.policy import ActorCritic
    from algos.ppo import PPO, PPOConfig
    from algos.spaces import obs_spec

    data = np.load(npz)
    ac = ActorCritic(obs_spec(gymnasium.spaces.Box(0, 255, OBS_SHAPE, np.uint8)), gymnasium.spaces.Discrete(N_ACTIONS),
                     hidden=(), shared_torso=True)
    variables = ac.variables()
    if len(variables) != len(PEER_ORDER):
        raise SystemExit(f"train.py's network has {len(variables)} variables, the peer's {len(PEER_ORDER)}")
    for variable, name in zip(variables, PEER_ORDER, strict=True):
        value = to_keras(name, data[f"w/{name}"], (64, 7, 7))
        if tuple(variable.shape) != value.shape:
            raise SystemExit(f"{name}: peer {value.shape} against train.py's {tuple(variable.shape)}")
        variable.assign(value)
    rows = len(data["act"])
    cfg = PPOConfig(lr=0.0, epochs=1, minibatch_size=rows, clip_ratio=CLIP, target_kl=0.0,
                    vf_coef=vf_coef, ent_coef=ENT_COEF, value_targets="raw", max_grad_norm=MAX_GRAD_NORM)
    ppo = PPO(ac, cfg, seed=0)
    ppo.update(data["obs"], data["act"].astype(np.int64), data["adv"].astype(np.float64), data["ret"])
    first_moments = ppo.optimizer.variables[2::2]
    np.savez(out, **{f"g/{name}": to_keras(name, data[f"g/{name}"], (64, 7, 7)) for name in PEER_ORDER},
             **{f"ours/{name}": m.numpy() / 0.1 for name, m in zip(PEER_ORDER, first_moments, strict=True)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the peer's torch seed and the batch's (default: 0)")
    parser.add_argument("--rows", type=int, default=256, help="batch rows, one minibatch (default: 256)")
    parser.add_argument("--out", type=Path, required=True, help="directory for results.md")
    parser.add_argument("--stage", choices=("torch", "tf"), help=argparse.SUPPRESS)
    parser.add_argument("--npz", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--vf_coef", type=float, default=0.5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "torch":
        torch_stage(args.seed, args.rows, args.vf_coef, args.npz)
        return 0
    if args.stage == "tf":
        tf_stage(args.npz, args.vf_coef, args.npz.with_suffix(".tf.npz"))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), load_average()
    lines = [f"# {__doc__.splitlines()[0]}", "",
             f"A random batch of {args.rows} rows (uniform uint8 frames, returns and advantages N(0, 1)), torch seed "
             f"{args.seed}; clip {CLIP}, entropy {ENT_COEF}, global-norm clip {MAX_GRAD_NORM}, value targets the "
             "returns as they are (Atari's settings). The gradients compared are the clipped ones each applies.", ""]
    tables: list[str] = []
    # train.py's --vf_coef 0.25 weighs the value loss as the peer's 0.5 does (0.5 x 0.5 x the squared error).
    for peer_vf, ours_vf in ((0.5, 0.25), (0.5, 0.5)):
        npz = args.out / f"peer_vf{peer_vf}.npz"
        for stage, vf in (("torch", peer_vf), ("tf", ours_vf)):
            subprocess.run([sys.executable, __file__, "--stage", stage, "--npz", str(npz), "--seed", str(args.seed),
                            "--rows", str(args.rows), "--vf_coef", str(vf), "--out", str(args.out)], check=True,
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        peer, ours = np.load(npz), np.load(npz.with_suffix(".tf.npz"))
        tables += [f"## peer --vf_coef {peer_vf}, train.py --vf_coef {ours_vf}", "",
                  f"peer's gradient before the clip: norm {float(peer['total_norm']):.4g} (policy and entropy part "
                  f"{float(peer['policy_norm']):.4g}, value part {float(peer['value_norm']):.4g}); clipped to "
                  f"{MAX_GRAD_NORM}", "",
                  "| variable | shape | peer's clipped gradient, norm | train.py's, norm | max abs difference / peer's "
                  "max abs | cosine |", "| --- | --- | --- | --- | --- | --- |"]
        for name in PEER_ORDER:
            g, o = ours[f"g/{name}"].astype(np.float64), ours[f"ours/{name}"].astype(np.float64)
            cosine = float((g * o).sum() / (np.linalg.norm(g) * np.linalg.norm(o) + 1e-30))
            tables.append(f"| {name} | {g.shape} | {np.linalg.norm(g):.4g} | {np.linalg.norm(o):.4g} | "
                         f"{np.abs(g - o).max() / (np.abs(g).max() + 1e-30):.2e} | {cosine:.6f} |")
        tables.append("")
        npz.unlink()
        npz.with_suffix(".tf.npz").unlink()
    lines += [*machine_lines(time.perf_counter() - started, f"{load:.2f}"), "", *tables]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
