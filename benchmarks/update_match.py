"""One Atari PPO gradient of train.py against the CleanRL-style peer's, from the same weights and the same batch.

The torch process builds the peer's network (peer_cleanrl_atari.Agent) from --seed, draws a batch of N rows (uint8
84x84x4 frames, actions, advantages N(0, 1); old log-probabilities and values from the network, and returns =
advantages + values, as a rollout records them) and computes the gradient of one minibatch of all N rows with the
peer's loss at its value weight 0.5 (its lines, copied: per-minibatch advantage normalization, clipped surrogate,
clipped value loss at 0.5 x the squared error, entropy bonus, global-norm clip). A TensorFlow process (a separate
one: TensorFlow and torch in one process can abort) loads those weights into train.py's ActorCritic and runs
algos.ppo's own update with a learning rate of 0, one epoch, one minibatch of N rows: its Adam's first moment is then
(1 - beta_1) x the clipped gradient it applied. The tables compare the two per variable, for train.py's Atari
defaults and for the value loss and advantages it used before them (--vf_coef 0.5 --value_loss mse --adv_norm
batch), and give the unclipped gradient's policy and value parts.

    python benchmarks/update_match.py --out benchmarks/results/update_match
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
CLIP, ENT_COEF, MAX_GRAD_NORM, PEER_VF_COEF = 0.1, 0.01, 0.5, 0.5
# train.py's settings compared: its Atari defaults (algos/registry.py), and the value loss and advantages before them.
SETTINGS = {"the Atari defaults": [], "--vf_coef 0.5 --value_loss mse --adv_norm batch": [
    "--vf_coef", "0.5", "--value_loss", "mse", "--adv_norm", "batch"]}


def torch_stage(seed: int, rows: int, out: Path) -> None:
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
    b_obs, b_act, b_adv = torch.as_tensor(obs), torch.as_tensor(act), torch.as_tensor(adv)
    with torch.no_grad():
        _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_act)
        b_values = b_values.view(-1)
    b_ret = b_adv + b_values
    ret = b_ret.numpy()

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
        return pg_loss - ENT_COEF * entropy.mean(), v_loss * PEER_VF_COEF, entropy.mean()

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


def tf_stage(npz: Path, settings: dict[str, object], out: Path) -> None:
    """train.py's side: its update at lr 0 from the peer's weights with PPO's ``settings`` (vf_coef, value_loss,
    adv_norm: PPOConfig's fields); its applied (clipped) gradient per variable."""
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
    cfg = PPOConfig(lr=0.0, epochs=1, minibatch_size=rows, clip_ratio=CLIP, target_kl=0.0, ent_coef=ENT_COEF,
                    value_targets="raw", max_grad_norm=MAX_GRAD_NORM, **settings)
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
    parser.add_argument("--vf_coef", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--value_loss", help=argparse.SUPPRESS)
    parser.add_argument("--adv_norm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "torch":
        torch_stage(args.seed, args.rows, args.npz)
        return 0
    if args.stage == "tf":
        from algos.registry import ALGORITHMS

        atari = ALGORITHMS["ppo"].defaults_for("atari")
        settings = {name: atari[name] if getattr(args, name) is None else getattr(args, name)
                    for name in ("vf_coef", "value_loss", "adv_norm")}
        tf_stage(args.npz, settings, args.npz.with_suffix(".tf.npz"))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), load_average()
    lines = [f"# {__doc__.splitlines()[0]}", "",
             f"A random batch of {args.rows} rows (uniform uint8 frames, advantages N(0, 1), returns = advantages + "
             f"the network's values), torch seed {args.seed}; clip {CLIP}, entropy {ENT_COEF}, global-norm clip "
             f"{MAX_GRAD_NORM}, value targets the returns as they are (Atari's settings); the peer's value weight "
             f"{PEER_VF_COEF}. The gradients compared are the clipped ones each applies.", ""]
    tables: list[str] = []
    npz = args.out / "peer.npz"
    run_stage = ["--npz", str(npz), "--seed", str(args.seed), "--rows", str(args.rows), "--out", str(args.out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, __file__, "--stage", "torch", *run_stage], check=True, cwd=REPO, env=env)
    peer = np.load(npz)
    for title, ours_args in SETTINGS.items():
        subprocess.run([sys.executable, __file__, "--stage", "tf", *run_stage, *ours_args], check=True, cwd=REPO,
                       env=env)
        ours = np.load(npz.with_suffix(".tf.npz"))
        tables += [f"## train.py at {title}", "",
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
        npz.with_suffix(".tf.npz").unlink()
    npz.unlink()
    lines += [*machine_lines(time.perf_counter() - started, f"{load:.2f}"), "", *tables]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
