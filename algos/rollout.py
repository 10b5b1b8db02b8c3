"""Collecting a rank's share of the batch from one gymnasium environment."""

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import gymnasium
import numpy as np

from algos.gae import gae_advantages
from algos.numpy_actor import NumpyActor
from algos.spaces import action_spec, obs_spec
from mpi_util import heartbeat

# With a shared budget, a rank takes this many lockstep steps of its envs at a time: one take (an MPI atomic, ~2 us)
# per 16 steps costs ~0.1% of a step's time, and the ranks finish within 16 steps (~2.5 ms) of each other.
TAKE_ROWS = 16


@dataclass
class _Steps:
    """What one collect's stepping recorded, time-major (row t: lockstep row t; K envs)."""

    obs: np.ndarray
    """(rows + 1, K, *obs shape) float32 vectors or uint8 images; obs[steps_of_env[k], k] is env k's observation to
    go on from."""
    act: np.ndarray
    """(rows, K, *act_shape): float32 unclipped, or int64 choices."""
    policy_out: np.ndarray
    """(rows, K, n_outputs) float32: the policy's outputs the actions were sampled from (NumpyActor.log_prob_of)."""
    rewards: np.ndarray
    """(rows, K) float64."""
    episode_ends: np.ndarray
    """(rows, K) bool: the episode terminated or was truncated at this step (under ``atari``, or a life was lost)."""
    truncated_steps: list[list[int]]
    """Per env, the rows where its episode was truncated (they bootstrap from the final observation)."""
    truncated_obs: list[list[np.ndarray]]
    """Per env, the final (obs_dim,) observations of those truncated episodes (before the reset)."""
    ep_return: list[float]
    """Per env, the return of the episode going on."""
    ep_length: list[int]
    """Per env, the steps of the episode going on."""
    ep_returns: list[float]
    """Returns of the episodes that finished."""
    ep_lengths: list[int]
    """Lengths of the episodes that finished."""
    steps_of_env: list[int]
    """Per env, its steps in this collect."""
    values: np.ndarray | None
    """(rows, K) float32 values of obs[t, k] in return units, found while acting when the actor's policy and value
    share a torso (one pass gives both); None when the value network runs apart, in one batched call afterwards."""


class RolloutWorker:
    """K gymnasium envs on one rank, stepped in lockstep with one batched forward pass of the actor per step (K
    rows), which spreads the actor's per-call cost over K env steps. Episodes continue across collect() calls (the
    batch is split across ranks and envs by steps, so an env's share may end mid-episode).

    envs: one env or a list of K envs of the same spaces. Env k's first reset uses reset(seed=seed_k) and its action
    space is seeded with seed_k, where seed_0 = seed (one env behaves as it did before envs could be several) and
    seed_k = SeedSequence(seed, spawn_key=(k,)) for k >= 1; later resets are unseeded so each env's own RNG carries
    on. gamma and lam are the GAE discount and trace parameters.
    """

    def __init__(self, envs: gymnasium.Env | Sequence[gymnasium.Env], seed: int, gamma: float, lam: float,
                 atari: bool = False) -> None:
        self.envs = [envs] if isinstance(envs, gymnasium.Env) else list(envs)
        if not self.envs:
            raise ValueError("need at least one env")
        env = self.envs[0]
        self.gamma = gamma
        self.lam = lam
        # Atari's training conventions (envs.atari): the value estimate ends at a lost life and learns from rewards
        # clipped to their sign; the episode, and its return, go on to the game's end.
        self.atari = atari
        self.obs = obs_spec(env.observation_space)  # ValueError names what is supported
        self.action = action_spec(env.action_space)
        self.is_discrete = self.action.discrete
        self.act_shape = self.action.shape
        self._obs = np.empty((len(self.envs), *self.obs.shape), dtype=self.obs.dtype)
        for k, env_k in enumerate(self.envs):
            seed_k = seed if k == 0 else int(np.random.SeedSequence(seed, spawn_key=(k,)).generate_state(1)[0])
            env_k.action_space.seed(seed_k)
            self._obs[k] = self._reset(env_k, seed_k)
        self._ep_return = np.zeros(len(self.envs))
        self._ep_length = np.zeros(len(self.envs), dtype=np.int64)
        self._lives = self._lives_left()

    def collect(
        self, n_steps: int, actor: NumpyActor, rng: np.random.Generator, take: Callable[[int], int] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Step the envs n_steps times in all with actor, sampling actions from rng: env k takes
        n_steps // K steps, one more when k < n_steps % K.

        take: draw the steps from a budget shared with other ranks instead (mpi_util.SharedBudget.take): take(m)
        returns how many of m more steps this rank may run, and the envs step in lockstep until it returns fewer
        than asked; n_steps is then the most this call will run. Env k again runs as many steps as env 0, or one
        fewer when k is at or past the remainder of the last take.

        Returns (batch, episodes):
            batch: {"obs": (n, obs_dim) float32 RAW observations or (n, H, W, C) uint8 images, "act": (n, act_dim)
                float32 unclipped, (n,) int64 (Discrete) or (n, d) int64 (MultiDiscrete, MultiBinary), "adv": (n,)
                float32 GAE advantages (not normalized), "ret": (n,) float32 value targets, "logp": (n,) float64
                log-probabilities of the actions under actor, the policy that sampled them}; env 0's steps first,
                then env 1's, and so on.
            episodes: {"ep_return": (E,) float64, "ep_length": (E,) int64} of the episodes that FINISHED
                (terminated or truncated) during this call, counting their steps from earlier calls too.

        Actions are clipped to the Box bounds only when passed to env.step. A terminated step has next
        value 0; a truncated one bootstraps from the value of the final observation step() returned (before
        the reset); an env's last step of the call, when its episode goes on, bootstraps from the value of the
        next observation.
        Raises ValueError naming the step when an observation or a reward is NaN or infinite.
        """
        steps = self._step_envs(n_steps, actor, rng, take)
        self._ep_return = np.array(steps.ep_return, dtype=np.float64)
        self._ep_length = np.array(steps.ep_length, dtype=np.int64)
        self._obs = np.stack([steps.obs[n, k] for k, n in enumerate(steps.steps_of_env)])
        env_obs = [steps.obs[:n, k] for k, n in enumerate(steps.steps_of_env)]
        advs, rets = [], []
        for k, (values, next_values, ends) in enumerate(self._bootstrap(steps, env_obs, actor)):
            n = steps.steps_of_env[k]
            adv, ret = gae_advantages(steps.rewards[:n, k], values, next_values, ends, self.gamma, self.lam)
            advs.append(adv)
            rets.append(ret)
        act = np.concatenate([steps.act[:n, k] for k, n in enumerate(steps.steps_of_env)])
        policy_out = np.concatenate([steps.policy_out[:n, k] for k, n in enumerate(steps.steps_of_env)])
        batch = {
            "obs": np.concatenate(env_obs),
            "act": act,
            "adv": np.concatenate(advs),
            "ret": np.concatenate(rets),
            # Rank 0's update needs them; from here it runs no pass of the batch to find them (PPO.update).
            "logp": actor.log_prob_of(policy_out, act),
        }
        episodes = {
            "ep_return": np.asarray(steps.ep_returns, dtype=np.float64),
            "ep_length": np.asarray(steps.ep_lengths, dtype=np.int64),
        }
        return batch, episodes

    def _step_envs(self, n_steps: int, actor: NumpyActor, rng: np.random.Generator,
                   take: Callable[[int], int] | None) -> _Steps:
        """Step the envs as collect() says, and record what it needs, time-major (_Steps)."""
        n_envs = len(self.envs)
        longest = -(-n_steps // n_envs)  # the most lockstep rows this call can run
        # Time-major, so that the actor reads one contiguous block per step and env k writes its next observation
        # straight into row t + 1 (cast to the row's dtype there).
        obs = np.empty((longest + 1, n_envs, *self.obs.shape), dtype=self.obs.dtype)
        obs[0] = self._obs
        act = np.empty((longest, n_envs, *self.act_shape), dtype=np.int64 if self.is_discrete else np.float32)
        policy_out = np.empty((longest, n_envs, actor.n_outputs), dtype=np.float32)
        rewards = np.zeros((longest, n_envs), dtype=np.float64)
        episode_ends = np.zeros((longest, n_envs), dtype=bool)
        truncated_steps: list[list[int]] = [[] for _ in range(n_envs)]
        truncated_obs: list[list[np.ndarray]] = [[] for _ in range(n_envs)]
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        # Python numbers in the step loop: indexing numpy arrays element by element costs more than the arithmetic.
        ep_return = self._ep_return.tolist()
        ep_length = self._ep_length.tolist()
        # x.dot(zeros) is NaN exactly when x holds a NaN or an infinity (0 * inf is NaN), and costs a fifth of
        # np.isfinite(x).all(). Images are integers: always finite.
        zeros = None if self.obs.is_image else np.zeros(self.obs.shape[0], dtype=np.float32)
        space = self.envs[0].action_space
        # np.minimum(np.maximum(...)) is np.clip bit for bit, without np.clip's Python-level dispatch, which
        # costs as much as the policy's forward pass at one row per step.
        low, high = (None, None) if self.is_discrete else (space.low, space.high)
        atari, lives = self.atari, self._lives
        values = np.empty((longest, n_envs), dtype=np.float32) if actor.torso_weights is not None else None

        rows, last_active = 0, n_envs
        for t, (active, noise) in enumerate(self._lockstep_rows(n_steps, take, actor, rng)):
            # The envs that step in row t are a prefix; only the last row can leave some out.
            rows, last_active = t + 1, active
            heartbeat()  # ranks waiting for this one see it advance
            if values is None:
                actions = actor.act_with_noise(obs[t, :active], noise, out=act[t, :active],
                                               outputs=policy_out[t, :active])
            else:
                actions, values[t, :active] = actor.act_and_value_with_noise(
                    obs[t, :active], noise, out=act[t, :active], outputs=policy_out[t, :active])
            if not self.is_discrete:
                env_actions = np.minimum(np.maximum(actions, low), high)
            else:  # Python ints for Discrete; MultiDiscrete and MultiBinary take their rows
                env_actions = actions.tolist() if self.act_shape == () else actions
            next_rows = obs[t + 1]
            for k in range(active):
                next_obs, reward, terminated, truncated, info = self.envs[k].step(env_actions[k])
                next_row = next_rows[k]
                next_row[...] = next_obs
                if not (math.isfinite(reward) and (zeros is None or math.isfinite(next_row.dot(zeros)))):
                    raise ValueError(
                        f"non-finite observation or reward at step {t} of this collect "
                        f"(env {k}, step {ep_length[k] + 1} of its episode): reward={reward}, "
                        f"observation={next_obs}"
                    )
                rewards[t, k] = reward if not atari else float(np.sign(reward))
                ep_return[k] += float(reward)
                ep_length[k] += 1
                if atari:
                    if info["lives"] < lives[k] and not (terminated or truncated):
                        episode_ends[t, k] = True  # a lost life ends the value estimate; the game goes on
                    lives[k] = info["lives"]
                if terminated or truncated:
                    episode_ends[t, k] = True
                    ep_returns.append(ep_return[k])
                    ep_lengths.append(ep_length[k])
                    ep_return[k] = 0.0
                    ep_length[k] = 0
                    if not terminated:
                        truncated_steps[k].append(t)
                        truncated_obs[k].append(next_row.copy())
                    next_row[...] = self._reset(self.envs[k], None)
                    if atari:
                        lives[k] = self.envs[k].unwrapped.ale.lives()
        steps_of_env = [rows if k < last_active else rows - 1 for k in range(n_envs)]
        return _Steps(obs, act, policy_out, rewards, episode_ends, truncated_steps, truncated_obs, ep_return, ep_length,
                      ep_returns, ep_lengths, steps_of_env, values)

    def _bootstrap(self, steps: _Steps, env_obs: list[np.ndarray],
                   actor: NumpyActor) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """For each env k, what its GAE needs: (values (n_k,), next values (n_k,), episode ends (n_k,) bool), where
        an episode cut by the end of this collect counts as ended and bootstraps from the observation it goes on
        from. env_obs[k]: env k's (n_k, obs_dim) observations."""
        n_envs, steps_of_env = len(self.envs), steps.steps_of_env
        # One batched value call for the whole collect: per-step calls would dominate the step loop. Rows: every
        # env's steps (found while acting, when the torso is shared), then every env's truncated final observations,
        # then the observations that go on.
        cut_by_batch = [n > 0 and not steps.episode_ends[n - 1, k] for k, n in enumerate(steps_of_env)]
        final_obs = [o[None] for k in range(n_envs) for o in steps.truncated_obs[k]]
        final_obs += [self._obs[k : k + 1] for k in range(n_envs) if cut_by_batch[k]]
        if steps.values is None:
            all_values = actor.value(np.concatenate(env_obs + final_obs, axis=0))
        else:
            all_values = np.concatenate([steps.values[:n, k] for k, n in enumerate(steps_of_env)]
                                        + ([actor.value(np.concatenate(final_obs, axis=0))] if final_obs else []))
        first_value = np.cumsum([0, *steps_of_env])
        next_truncated = sum(steps_of_env)
        next_cut = next_truncated + sum(len(truncated) for truncated in steps.truncated_steps)
        per_env = []
        for k, n in enumerate(steps_of_env):
            ends = steps.episode_ends[:n, k].copy()
            values = all_values[first_value[k] : first_value[k] + n]
            truncated = steps.truncated_steps[k]
            # Inside an episode the next value is the next step's; at an episode's end it is 0 (terminated) unless
            # overwritten just below by a bootstrap (truncated, or cut by the end of this collect).
            next_values = np.zeros(n, dtype=np.float64)
            next_values[:-1] = np.where(ends[:-1], 0.0, values[1:])
            next_values[truncated] = all_values[next_truncated : next_truncated + len(truncated)]
            next_truncated += len(truncated)
            if cut_by_batch[k]:
                ends[-1] = True
                next_values[-1] = all_values[next_cut]
                next_cut += 1
            per_env.append((values, next_values, ends))
        return per_env

    def _lockstep_rows(
        self, n_steps: int, take: Callable[[int], int] | None, actor: NumpyActor, rng: np.random.Generator
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Each lockstep row of a collect of n_steps, or of what take gives: how many envs (the first ones) step in
        it, and their exploration noise. The noise is drawn from rng for a whole block of rows at once (the
        collect, or one take), the same numbers as one draw per row: a draw per step costs as much as a layer."""
        n_envs = len(self.envs)
        while n_steps > 0:
            asked = n_steps if take is None else min(TAKE_ROWS * n_envs, n_steps)
            got = asked if take is None else take(asked)
            n_steps -= got
            noise = actor.exploration_noise(rng, got)
            full_rows, remainder = divmod(got, n_envs)
            for start in range(0, full_rows * n_envs, n_envs):
                yield n_envs, noise[start : start + n_envs]
            if remainder:
                yield remainder, noise[got - remainder :]
            if got < asked:
                return

    def _lives_left(self) -> list[int]:
        """Each Atari env's lives now (read from the emulator); [] for other envs."""
        return [env.unwrapped.ale.lives() for env in self.envs] if self.atari else []

    def episode_state(self) -> dict:
        """The episodes in progress, for a checkpoint: {"obs": (K, *obs shape) current observations,
        "ep_return": (K,) float64 and "ep_length": (K,) int64 so far}. The envs' own states are saved separately."""
        return {"obs": self._obs.copy(), "ep_return": self._ep_return.copy(), "ep_length": self._ep_length.copy()}

    def restore_episode(self, state: dict) -> None:
        """Continue the episodes episode_state() saved (after self.envs were restored to the same moment)."""
        self._obs = np.array(state["obs"], dtype=self.obs.dtype).reshape(len(self.envs), *self.obs.shape)
        self._ep_return = np.array(state["ep_return"], dtype=np.float64).reshape(len(self.envs))
        self._ep_length = np.array(state["ep_length"], dtype=np.int64).reshape(len(self.envs))
        self._lives = self._lives_left()  # the restored emulators know their lives

    @staticmethod
    def _reset(env: gymnasium.Env, seed: int | None) -> np.ndarray:
        """Reset env; the first observation as an array, ValueError if NaN or infinite."""
        obs, _ = env.reset(seed=seed)
        obs = np.asarray(obs)
        if obs.dtype.kind == "f":
            obs = obs.astype(np.float32)
        if obs.dtype.kind == "f" and not np.all(np.isfinite(obs)):
            raise ValueError(f"non-finite observation from env.reset(): {obs}")
        return obs
