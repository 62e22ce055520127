"""Rollout throughput: jaxagent's jitted FrozenLake env and multi-turn rollout vs gymnasium + transformers.

    python -m experiments.bench_rollout --json             # one JSON line, both sides measured in this run
    python -m experiments.bench_rollout --json --profile   # + where the JAX rollout's time goes

1. Env stepping (`env_ratio`). JAX: `--env-batch` maps (`sample_tasks`), `FrozenLake.step_action`
   vmapped over them inside a jitted `lax.scan` of `--env-steps` steps, uniformly random actions drawn
   in the graph, autoreset to the start cell on termination or after 100 steps (gymnasium's 4x4 time
   limit). `env_ratio` uses the dynamics alone: the step's text observation is not consumed, so XLA
   compiles its rendering away, and the state (cell index) is the observation, as in gymnasium's
   FrozenLake-v1. `env_text_obs_ratio`: the same loop with the rendered token observation consumed
   every step (what the rollout needs). gymnasium: `SyncVectorEnv` of `gym.make("FrozenLake-v1",
   desc=<the same maps as 'SFHG' rows>, is_slippery=False)` (its default wrappers and next-step
   autoreset) over the first `--gym-envs` maps, actions from numpy. Timed: the step loop only (env
   construction and the first reset excluded on both sides; JAX compile excluded), repeats interleaved
   (both sides run in this process).
   steps/s = envs x steps / median time.

2. Rollout (`rollout_ratio`). Episodes of the toy world (`make_toy_world`: word-level tokenizer,
   FrozenLake, Qwen3 chat layout) with the study's task settings (`TaskSettings`, quick preset's T_max,
   max action tokens and context), batch `--batch`, full budgets (the study's default), temperature-1
   sampling, at two shapes: the study's default policy shape (quick preset's model, toy vocab) and a
   ~1M-parameter shape (hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32). Both sides use the same
   random weights (`qwen3.init`, written with `weights.save`, read by transformers'
   `Qwen3ForCausalLM.from_pretrained`, f32, sdpa attention, `torch.set_num_threads(--torch-threads)`),
   the same maps and budgets.

   Timed, JAX: one call of `jaxagent.rollout.rollout` (host checks + the single jitted program: reset,
   system-prompt prefill, T_max turns of chunk building, cache append, sampling with a KV cache, env
   step, bookkeeping) until its outputs are ready; compile time is reported apart (`*_jax_compile_s`).

   Timed, PyTorch (`torch_rollout`): the whole loop a PyTorch + gymnasium implementation runs: reset of
   one gymnasium FrozenLakeEnv per episode (constructed from the maps beforehand, untimed), system prompt
   prefilled once (batch 1) and its `DynamicCache` repeated to the batch (as jaxagent does), then per
   turn: the prompt chunk built on the host (layout pieces as token ids + the budget text and the
   observation rendered to words from the gymnasium state, encoded in one `encode_batch` call), appended
   to the cache, replies sampled token by token (softmax / multinomial, stop at <|im_end|> or
   <|endoftext|> or the token limit, each sampled token fed back), replies decoded to text and the action
   parsed with a regex (the last <answer>Move</answer>), gymnasium `step` on the host, status / reward /
   logprob bookkeeping. KV cache: never re-prefilled; each forward feeds only the new chunk or token.
   Rows have different lengths: chunks are right-padded to the turn's longest chunk and rows that have
   stopped feed a pad token, all such pads get attention-mask 0 (holes in the cache that no query ever
   attends to), and each row gets explicit position ids = its count of real tokens, so RoPE positions
   equal jaxagent's slot positions. Rows whose episode is over are dropped from the cache
   (`batch_select_indices`), which jaxagent does not do (its batch is static).
   Both sides are warmed up; a turn-by-turn replay of JAX's sampled replies through the torch loop
   (untimed) checks that both build identical token streams and compute the same log-probabilities
   (`*_replay_tokens_equal`, `*_replay_logprob_max_abs_diff`).

   episodes/s = batch / median time over `--repeats` repeats (a new sampling key each repeat). Model
   FLOPs = 2 x params x tokens processed (the system prompt once per batch + every episode's chunk and
   reply tokens, i.e. real tokens, no padding; attention FLOPs are not counted); `*_frac_peak` =
   achieved model FLOP/s / `matmul_peak_gflops`, the larger of the f32 square-matmul GFLOP/s of jitted
   jax and of torch (its best peer setting) measured in the same run.

`--profile` adds `<shape>_profile`: the same JAX rollout with the scripted noisy expert instead of the
model (chunk building + env + bookkeeping, no model call) and with twice the cache slots (same episodes;
the difference is the time that scales with the attention window / cache size, not with the tokens).

The PyTorch side runs in worker processes (`experiments.bench_common`) at every torch thread count and
OpenMP wait policy, on the same maps and from the same sampling seed at each setting; per shape the
setting with the fastest median rollout is reported (`<shape>_torch_threads`,
`<shape>_omp_wait_policy`, every setting in `<shape>_torch_settings`; the top-level `torch_threads` /
`omp_wait_policy` are those of the shape that gives `rollout_ratio`). This process runs the JAX side, the
gymnasium env bench and the replay check (torch at 1 thread). The run's machine load is reported
(`other_cores`, `loadavg_1m_*`, `loadavg_start` / `loadavg_end`); on a busy machine (the rule in
bench_common) every `*_ratio` is null and reported as `*_ratio_busy`.

Legend: B episodes, N turns (T_max), S cache slots, W chunk width, M action tokens, V vocab, L map side.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench_common import (LoadMeter, flag_busy, peer_settings, per_setting, pick_best,
                                     run_peer_workers, setting_fields)
from experiments.bench_model import matmul_peak_gflops
from jaxagent.envs.jax import frozenlake as fl
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.budgets import DEFAULT_TEMPLATE
from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import types
from jaxagent.rollout.episode import max_chunk
from jaxagent.rollout.jax_loop import RolloutConfig, rollout
from jaxagent.sampling import Sampler
from jaxagent.study.stages import TaskSettings
from jaxagent.study.toy import ToyWorld, make_toy_world
from jaxagent.xla_options import COMPILER_OPTIONS

GYM_TIME_LIMIT = 100  # gymnasium registers FrozenLake-v1 (4x4) with max_episode_steps=100
ONE_M_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32)
_ACTION_RE = re.compile(r"<answer>(Left|Down|Right|Up)</answer>")


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_time(fn, repeats: int) -> float:
    return statistics.median(_time(fn) for _ in range(repeats))


# ------------------------------------------------------------------ matmul peak
def jax_matmul_gflops(n: int, repeats: int) -> float:
    """Best f32 n x n matmul GFLOP/s through XLA, with its default options and with jaxagent's."""
    return max(matmul_peak_gflops(n, repeats, compiler_options=o) for o in (None, COMPILER_OPTIONS))


def torch_matmul_gflops(n: int, repeats: int) -> float:
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    return 2 * n ** 3 / min(_time(lambda: torch.mm(a, b)) for _ in range(repeats)) / 1e9


# ------------------------------------------------------------------ 1. env stepping
def gym_desc(map_LxL) -> list[str]:
    """Our int8 cell codes (frozenlake_solver: FROZEN 0, HOLE 1, START 2, GOAL 3) as gymnasium 'SFHG' rows."""
    return ["".join(fl.CELL_WORDS[int(c)] for c in row) for row in np.asarray(map_LxL)]


def make_jax_env_run(env: fl.FrozenLake, env_params, n_steps: int, text_obs: bool):
    """jitted (maps [E, L, L], key) -> checksum: E envs x n_steps random-action steps with autoreset.

    `text_obs` False: the step's observation is not consumed, so XLA compiles its text rendering away
    and the step is the dynamics alone (gymnasium's FrozenLake returns an int cell index, no text);
    True: the rendered tokens feed the checksum, so every step renders the text observation too.
    """
    step = jax.vmap(env.step_action, in_axes=(0, 0, None))

    @jax.jit
    def run(maps_ExLxL, key):
        n = maps_ExLxL.shape[0]
        k_reset, k_steps = jax.random.split(key)
        states, _ = jax.vmap(env.reset, in_axes=(0, 0, None))(jax.random.split(k_reset, n), maps_ExLxL, env_params)
        start_E = states.pos

        def body(carry, k):
            st, acc = carry
            out = step(st, jax.random.randint(k, (n,), 0, fls.N_ACTIONS), env_params)
            new = out.state
            reset = new.done | (new.t >= GYM_TIME_LIMIT)
            new = new._replace(pos=jnp.where(reset, start_E, new.pos), t=jnp.where(reset, 0, new.t),
                               done=jnp.zeros_like(new.done), success=jnp.zeros_like(new.success))
            acc = acc + jnp.sum(out.reward) + jnp.sum(new.pos)
            if text_obs:
                acc = acc + jnp.sum(out.obs.length) + jnp.sum(out.obs.tokens[:, -1])
            return (new, acc), None

        (_, acc), _ = jax.lax.scan(body, (states, jnp.float32(0)), jax.random.split(k_steps, n_steps))
        return acc

    return run


def bench_env(world: ToyWorld, ts: TaskSettings, args) -> dict:
    import gymnasium as gym
    from gymnasium.vector import SyncVectorEnv

    maps = ts.sample(jax.random.key(args.seed + 7), args.env_batch)
    runs = {"dyn": make_jax_env_run(world.env, ts.env_params(), args.env_steps, text_obs=False),
            "text": make_jax_env_run(world.env, ts.env_params(), args.env_steps, text_obs=True)}
    t0 = time.perf_counter()
    for run in runs.values():
        run(maps, jax.random.key(0)).block_until_ready()
    compile_s = time.perf_counter() - t0

    maps_np = np.asarray(maps)[: args.gym_envs]
    descs = [gym_desc(m) for m in maps_np]
    venv = SyncVectorEnv([lambda d=d: gym.make("FrozenLake-v1", desc=d, is_slippery=False) for d in descs])
    venv.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)

    def gym_run():
        for _ in range(args.gym_steps):
            venv.step(rng.integers(0, fls.N_ACTIONS, len(descs)))

    gym_run()  # warm-up
    times = {"dyn": [], "text": [], "gym": []}
    for r in range(args.repeats):  # interleaved: every side sees the same machine load
        for name, run in runs.items():
            times[name].append(_time(lambda: run(maps, jax.random.key(r + 1)).block_until_ready()))
        times["gym"].append(_time(gym_run))
    venv.close()
    jax_sps = args.env_batch * args.env_steps / statistics.median(times["dyn"])
    text_sps = args.env_batch * args.env_steps / statistics.median(times["text"])
    gym_sps = len(descs) * args.gym_steps / statistics.median(times["gym"])
    return {"env_batch": args.env_batch, "env_steps": args.env_steps, "gym_envs": len(descs),
            "gym_steps": args.gym_steps, "jax_env_compile_s": compile_s, "jax_env_steps_per_s": jax_sps,
            "jax_env_text_obs_steps_per_s": text_sps, "gym_env_steps_per_s": gym_sps,
            "env_ratio": jax_sps / gym_sps, "env_text_obs_ratio": text_sps / gym_sps}


# ------------------------------------------------------------------ 2. the PyTorch + gymnasium rollout
class HostText:
    """Host-side pieces of the episode layout for the PyTorch loop: the same token pieces and the same
    words as jaxagent's in-graph `episode.prompt_chunk` / `FrozenLake._observe`, as text encoded by the tokenizer."""

    MESSAGES = tuple(" ".join(m) for m in fl.MESSAGES)

    def __init__(self, world: ToyWorld):
        lay = world.layout
        self.system, self.first_open, self.next_open = list(lay.system), list(lay.first_open), list(lay.next_open)
        self.close, self.stop_ids, self.pad_id = list(lay.close), tuple(lay.stop_ids), lay.pad_id
        self.backend = world.tokenizer.hf.backend_tokenizer  # tokenizers.Tokenizer: batch encode / decode
        self.template = " ".join(DEFAULT_TEMPLATE)
        if world.fmt.template != DEFAULT_TEMPLATE:
            raise ValueError("HostText renders the default budget template only")

    def observation(self, desc: list[str], pos: int, msg: int) -> str:
        """FrozenLake._observe as text: message words, then the grid row by row ("P" is you), rows
        separated by "|"."""
        size = len(desc)
        rows = [" ".join("P" if r * size + c == pos else desc[r][c] for c in range(size)) for r in range(size)]
        grid = " | ".join(rows)
        return f"{self.MESSAGES[msg]} {grid}" if msg else grid

    def chunks(self, t: int, budgets, texts: list[str]) -> list[list[int]]:
        """Per episode: [turn opener] + tokens(budget text + observation) + [close]."""
        opener = self.first_open if t == 0 else self.next_open
        full = [self.template.format(turn=t + 1, budget=b, remaining=b - t) + " " + o for b, o in zip(budgets, texts)]
        return [opener + e.ids + self.close for e in self.backend.encode_batch(full, add_special_tokens=False)]

    def parse(self, replies: list[list[int]]) -> list[int]:
        """Env action index of the last <answer>Move</answer> in each reply's text, -1 if none."""
        out = []
        for text in self.backend.decode_batch(replies, skip_special_tokens=False):
            found = _ACTION_RE.findall(text)
            out.append(fl.ACTION_NAMES.index(found[-1]) if found else -1)
        return out


def make_gym_envs(maps_BxLxL) -> list:
    """One gymnasium FrozenLakeEnv per episode on our maps (deterministic moves), built once (untimed)."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    return [FrozenLakeEnv(desc=gym_desc(m), is_slippery=False) for m in np.asarray(maps_BxLxL)]


def torch_rollout(model, host: HostText, envs, budgets, *, t_max: int, max_action_tokens: int, max_context: int,
                  temperature: float, generator, format_penalty: float = 0.0, forced=None) -> dict:
    """The PyTorch + gymnasium multi-turn rollout (see the module docstring); returns per-episode
    tokens, logprobs (0 on non-policy tokens), actions [B, N], rewards [B, N], status, lengths.

    `forced[b][t]` (replay check): the reply tokens of episode b at turn t are taken from it instead of
    being sampled; log-probabilities are still computed by this model.
    """
    import torch
    from transformers import DynamicCache

    n_ep, m, stop = len(envs), max_action_tokens, torch.tensor(host.stop_ids)
    budgets = [int(b) for b in budgets]
    descs = [["".join(c.decode() for c in row) for row in e.desc.tolist()] for e in envs]
    pos = [int(e.reset()[0]) for e in envs]
    msg = [fl.MSG_NONE] * n_ep
    status = [types.RUNNING] * n_ep
    tokens = [list(host.system) for _ in range(n_ep)]
    logps = [[0.0] * len(host.system) for _ in range(n_ep)]
    actions = np.full((n_ep, t_max), -1, np.int32)
    rewards = np.zeros((n_ep, t_max), np.float32)

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([host.system]), cache=cache, use_cache=True)
        cache.batch_repeat_interleave(n_ep)
        rows = list(range(n_ep))                                   # episode of each cache row
        attn = torch.ones((n_ep, len(host.system)), dtype=torch.long)  # 0 = padding hole in the cache
        for t in range(t_max):
            cand = [b for b in rows if status[b] == types.RUNNING and t < budgets[b]]
            chunks = host.chunks(t, [budgets[b] for b in cand],
                                 [host.observation(descs[b], pos[b], msg[b]) for b in cand])
            act, act_chunks = [], []
            for b, c in zip(cand, chunks):
                if len(tokens[b]) + len(c) + m <= max_context:
                    act.append(b)
                    act_chunks.append(c)
                else:
                    status[b] = types.CONTEXT_EXHAUSTED
            if not act:
                break
            if act != rows:  # drop finished episodes from the batch and the cache
                keep = torch.tensor([rows.index(b) for b in act])
                cache.batch_select_indices(keep)
                attn, rows = attn[keep], act
            n_act = len(act)
            lens = torch.tensor([len(tokens[b]) for b in act])     # real tokens so far = next RoPE position
            clen = torch.tensor([len(c) for c in act_chunks])
            width = int(clen.max())
            ids = torch.full((n_act, width), host.pad_id, dtype=torch.long)
            for i, c in enumerate(act_chunks):
                ids[i, :len(c)] = torch.tensor(c)
                tokens[act[i]].extend(c)
                logps[act[i]].extend([0.0] * len(c))
            k = torch.arange(width)
            attn = torch.cat([attn, (k[None] < clen[:, None]).long()], dim=1)
            out = model(input_ids=ids, attention_mask=attn, position_ids=lens[:, None] + k[None], cache=cache,
                        use_cache=True)
            logits = out.logits[torch.arange(n_act), clen - 1].float()
            lens = lens + clen

            replies = [[] for _ in act]
            done = torch.zeros(n_act, dtype=torch.bool)
            n_gen = torch.zeros(n_act, dtype=torch.long)
            for j in range(m):
                logp_all = torch.log_softmax(logits / temperature, dim=-1)
                if forced is None:
                    tok = torch.multinomial(logp_all.exp(), 1, generator=generator)[:, 0]
                else:
                    tok = torch.tensor([forced[b][t][j] if j < len(forced[b][t]) else host.pad_id for b in act])
                live = ~done
                tok = torch.where(live, tok, host.pad_id)
                lp = logp_all.gather(1, tok[:, None])[:, 0]
                for i in torch.nonzero(live)[:, 0].tolist():
                    replies[i].append(int(tok[i]))
                    logps[act[i]].append(float(lp[i]))
                n_gen = n_gen + live
                done = done | (live & torch.isin(tok, stop)) | (n_gen >= m)
                if forced is not None:
                    done = done | torch.tensor([len(forced[b][t]) <= j + 1 for b in act])
                attn = torch.cat([attn, live[:, None].long()], dim=1)
                out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=lens[:, None], cache=cache,
                            use_cache=True)
                logits = torch.where(live[:, None], out.logits[:, -1].float(), logits)
                lens = lens + live
                if bool(done.all()):
                    break

            for b, r, a in zip(act, replies, host.parse(replies)):  # the environment, on the host
                tokens[b].extend(r)
                actions[b, t] = a
                if a < 0:
                    msg[b], rewards[b, t] = fl.MSG_INVALID, -format_penalty
                else:
                    obs, rew, terminated, _, _ = envs[b].step(a)
                    pos[b], rewards[b, t] = int(obs), float(rew)
                    cell = descs[b][pos[b] // len(descs[b])][pos[b] % len(descs[b])]
                    msg[b] = {"G": fl.MSG_GOAL, "H": fl.MSG_HOLE}.get(cell, fl.MSG_NONE)
                    if terminated:
                        status[b] = types.SUCCESS if cell == "G" else types.FAILED
                        continue
                if t + 1 >= budgets[b]:
                    status[b] = types.BUDGET_EXHAUSTED
    return {"tokens": tokens, "logprobs": logps, "actions": actions, "rewards": rewards,
            "status": np.asarray(status), "length": np.asarray([len(x) for x in tokens])}


def replay_check(model, host, envs, budgets, jx, rcfg: RolloutConfig, temperature: float) -> dict:
    """Feeds JAX's sampled replies through the torch loop: same token stream, actions, statuses, and
    log-probabilities of the same tokens under the same weights."""
    import torch

    toks, start, n = (np.asarray(x) for x in (jx.tokens, jx.turns.span_start, jx.turns.span_len))
    forced = [[toks[b, start[b, t]:start[b, t] + n[b, t]].tolist() for t in range(rcfg.t_max)]
              for b in range(len(envs))]
    th = torch_rollout(model, host, envs, budgets, t_max=rcfg.t_max, max_action_tokens=rcfg.max_action_tokens,
                       max_context=rcfg.max_context, temperature=temperature, generator=None, forced=forced)
    jl, jlp = np.asarray(jx.length), np.asarray(jx.logprobs)
    same = all(th["tokens"][b] == toks[b, :jl[b]].tolist() for b in range(len(envs)))
    diff = max(float(np.max(np.abs(np.asarray(th["logprobs"][b]) - jlp[b, :jl[b]]))) if len(th["logprobs"][b])
               == jl[b] else float("inf") for b in range(len(envs)))
    return {"replay_tokens_equal": bool(same),
            "replay_actions_equal": bool((th["actions"] == np.asarray(jx.turns.action)).all()),
            "replay_status_equal": bool((th["status"] == np.asarray(jx.status)).all()),
            "replay_logprob_max_abs_diff": diff}


def tokens_processed(lengths, sys_len: int) -> int:
    """Real tokens through the model: the shared system prompt once + every episode's own tokens."""
    return int(sys_len + np.sum(np.asarray(lengths) - sys_len))


def _torch_model(model_dir: str):
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def peer_worker(spec: dict, threads: list[int]) -> dict:
    """Worker side (run by bench_common): per thread count, the torch matmul peak and, per shape, the
    timed PyTorch + gymnasium rollouts (one warm-up, then `repeats`), each setting from the same seed."""
    import torch

    world = make_toy_world(spec["tokenizer_dir"], size=spec["map_size"])
    host, sys_len = HostText(world), len(world.layout.system)
    budgets = np.asarray(spec["budgets"], np.int32)
    shapes = {name: (_torch_model(sh["model_dir"]), make_gym_envs(np.load(sh["tasks_npy"])))
              for name, sh in spec["shapes"].items()}
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        res = {"matmul_gflops": torch_matmul_gflops(spec["matmul_n"], 5), "shapes": {}}
        for name, (model, envs) in shapes.items():
            gen = torch.Generator().manual_seed(spec["seed"])

            def run():
                return torch_rollout(model, host, envs, budgets, t_max=spec["t_max"],
                                     max_action_tokens=spec["max_action_tokens"], max_context=spec["max_context"],
                                     temperature=spec["temperature"], generator=gen,
                                     format_penalty=spec["format_penalty"])

            warm_s = _time(run)
            times, toks = [], []
            for _ in range(spec["repeats"]):
                t0 = time.perf_counter()
                th = run()
                times.append(time.perf_counter() - t0)
                toks.append(tokens_processed(th["length"], sys_len))
            res["shapes"][name] = {"s": statistics.median(times), "min_s": min(times), "warmup_s": warm_s,
                                   "tokens": statistics.mean(toks),
                                   "success_rate": float(np.mean(th["status"] == types.SUCCESS))}
        out[t] = res
    return out


def bench_jax_shape(name: str, cfg: Qwen3Config, world: ToyWorld, ts: TaskSettings, args, workdir: str) -> tuple:
    """The JAX rollout of one shape, timed, and the replay check; writes the weights and maps the
    peer workers read. Returns (partial results, the shape's worker spec)."""
    params = qwen3.init(cfg, jax.random.key(args.seed))
    model_dir, tasks_npy = os.path.join(workdir, f"model_{name}"), os.path.join(workdir, f"tasks_{name}.npy")
    weights.save(model_dir, cfg, params)
    model = _torch_model(model_dir)
    rcfg = RolloutConfig(t_max=ts.t_max, max_action_tokens=ts.max_action_tokens, max_context=ts.max_context,
                         sampler=Sampler(temperature=args.temperature))
    env_params = ts.env_params()
    tasks = ts.sample(jax.random.key(args.seed + 1), args.batch)
    np.save(tasks_npy, np.asarray(tasks))
    budgets = np.full((args.batch,), ts.t_max, np.int32)
    host = HostText(world)
    envs = make_gym_envs(tasks)

    def jax_run(k):
        r = rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, jax.random.key(k), env_params,
                    rcfg)
        return jax.block_until_ready(r)

    t0 = time.perf_counter()
    jx = jax_run(1000)
    compile_s = time.perf_counter() - t0
    check = replay_check(model, host, envs, budgets, jx, rcfg, args.temperature)
    del model
    jax_t, jax_tok = [], []
    sys_len = len(world.layout.system)
    for r in range(args.repeats):
        t0 = time.perf_counter()
        jx = jax_run(r)
        jax_t.append(time.perf_counter() - t0)
        jax_tok.append(tokens_processed(jx.length, sys_len))
    jt = statistics.median(jax_t)
    out = {"params": cfg.num_params(), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
           "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
           "vocab": cfg.vocab_size, "jax_compile_s": compile_s, "jax_episodes_per_s": args.batch / jt, "jax_s": jt,
           "jax_tokens_per_episode": statistics.mean(jax_tok) / args.batch,
           "jax_success_rate": float(np.mean(np.asarray(jx.success))), **check}
    if args.profile:
        out["profile"] = profile_jax(params, cfg, world, ts, rcfg, tasks, budgets, jt, args)
    return out, {"model_dir": model_dir, "tasks_npy": tasks_npy}


def finish_shape(name: str, out: dict, peer: dict, args, peak: float) -> dict:
    """Adds the peer's figures at its best setting for this shape; keys prefixed with the shape name."""
    runs = {s: r["shapes"][name] for s, r in peer.items()}
    best = pick_best({s: r["s"] for s, r in runs.items()})
    tr, jt = runs[best], out["jax_s"]
    n_params = out["params"]
    jax_gflops = 2 * n_params * out["jax_tokens_per_episode"] * args.batch / jt / 1e9
    torch_gflops = 2 * n_params * tr["tokens"] / tr["s"] / 1e9
    out = {**out, **setting_fields(best),
           "torch_settings": per_setting(runs, lambda r: {"s": r["s"], "min_s": r["min_s"],
                                                          "episodes_per_s": args.batch / r["s"]}),
           "torch_warmup_s": tr["warmup_s"], "torch_episodes_per_s": args.batch / tr["s"],
           "rollout_ratio": tr["s"] / jt, "torch_s": tr["s"], "torch_tokens_per_episode": tr["tokens"] / args.batch,
           "jax_model_gflops": jax_gflops, "torch_model_gflops": torch_gflops,
           "jax_frac_peak": jax_gflops / peak, "torch_frac_peak": torch_gflops / peak,
           "torch_success_rate": tr["success_rate"]}
    return {f"{name}_{k}": v for k, v in out.items()}


# ------------------------------------------------------------------ profile of the JAX rollout
def profile_jax(params, cfg, world: ToyWorld, ts: TaskSettings, rcfg: RolloutConfig, tasks, budgets, total_s,
                args) -> dict:
    """Where one JAX rollout's time goes, from whole-rollout variants (each compiled, then timed):
    the scripted noisy expert instead of the model (chunk building + env + bookkeeping, no model), and
    the same rollout with twice the cache slots (same episodes and tokens; only the attention window
    and cache size double: the difference is the time that scales with max_context)."""
    from jaxagent.envs.jax.experts import NoisyExpert

    reps = max(args.repeats, 3)
    env_params = ts.env_params()

    def timed(p, c, r):
        run = lambda k: jax.block_until_ready(rollout(p, c, world.env, world.layout, world.fmt, tasks, budgets,
                                                      jax.random.key(k), env_params, r))
        run(0)
        return _median_time(lambda: run(1), reps)

    no_model = timed({"unused": np.zeros((), np.float32)}, None,
                     dataclasses.replace(rcfg, expert_fn=NoisyExpert(0.25)))
    wide = timed(params, cfg, dataclasses.replace(rcfg, max_context=2 * rcfg.max_context))
    w = max_chunk(world.layout, world.fmt, world.env, rcfg.t_max)
    return {"rollout_s": total_s, "no_model_rollout_s": no_model, "rollout_2x_context_s": wide,
            "chunk_width": w, "padded_tokens_per_episode": rcfg.t_max * (w + rcfg.max_action_tokens)}


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_rollout", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--batch", type=int, default=64, help="episodes per rollout batch (default: 64)")
    p.add_argument("--t-max", type=int, default=0,
                   help="turns per episode (budget = T_max); 0: the quick preset's T_max (default: 0)")
    p.add_argument("--max-context", type=int, default=0,
                   help="KV-cache slots per episode; 0: the quick preset's (enough for --t-max <= 6), or "
                        "system + T_max x (chunk + reply) rounded up to 64 for a larger --t-max (default: 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--shapes", default="default,1m",
                   help="comma-separated model shapes: 'default' (quick preset model, toy vocab) and/or '1m' "
                        "(hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32) (default: default,1m)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed repeats per side (the peer's at each setting); medians reported (default: 3)")
    p.add_argument("--env-batch", type=int, default=4096, help="JAX env bench: maps stepped at once (default: 4096)")
    p.add_argument("--env-steps", type=int, default=200, help="JAX env bench: scan length (default: 200)")
    p.add_argument("--gym-envs", type=int, default=1024,
                   help="gymnasium env bench: sub-envs of the SyncVectorEnv, the first maps of --env-batch "
                        "(default: 1024)")
    p.add_argument("--gym-steps", type=int, default=20, help="gymnasium env bench: vector steps (default: 20)")
    p.add_argument("--matmul-n", type=int, default=1024,
                   help="side of the square f32 matmul measuring the peak (default: 1024)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch.set_num_threads of the PyTorch peer; 0: its best of 1..N (default: 0)")
    p.add_argument("--skip-env", action="store_true", help="skip the env-stepping benchmark")
    p.add_argument("--profile", action="store_true",
                   help="also time the JAX rollout without the model (scripted expert) and with twice the cache "
                        "slots, per shape")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, maps and sampling (default: 0)")
    args = p.parse_args(argv)
    meter = LoadMeter()  # the run's load window starts here
    for name in ("batch", "repeats", "env_batch", "env_steps", "gym_envs", "gym_steps", "matmul_n"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.torch_threads < 0:
        p.error("--torch-threads must be >= 0")
    if args.t_max < 0 or args.max_context < 0:
        p.error("--t-max and --max-context must be >= 0")
    if args.gym_envs > args.env_batch:
        p.error("--gym-envs must be <= --env-batch (the gymnasium envs use the first maps of the JAX batch)")
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in ("default", "1m")]
    if bad or not shapes:
        p.error(f"--shapes takes 'default' and/or '1m', got {args.shapes!r}")

    import torch
    from jaxagent.study.frozenlake.presets import PRESETS

    torch.set_num_threads(1)  # this process's torch work (the replay check) is untimed; the peer runs in workers
    preset = PRESETS["quick"]
    ts = preset.task
    with tempfile.TemporaryDirectory() as d:
        world = make_toy_world(os.path.join(d, "tokenizer"), size=ts.size)
        if args.t_max:
            ts = dataclasses.replace(ts, t_max=args.t_max)
        need = len(world.layout.system) + ts.t_max * (max_chunk(world.layout, world.fmt, world.env, ts.t_max)
                                                       + ts.max_action_tokens)
        if args.max_context:
            ts = dataclasses.replace(ts, max_context=args.max_context)
        elif args.t_max and need > ts.max_context:
            ts = dataclasses.replace(ts, max_context=-(-need // 64) * 64)
        vocab = world.tokenizer.vocab_size
        cfgs = {"default": dataclasses.replace(preset.model, vocab_size=vocab),
                "1m": Qwen3Config(vocab_size=vocab, **ONE_M_SHAPE)}

        jax_peak = jax_matmul_gflops(args.matmul_n, 5)
        result = {"batch": args.batch, "t_max": ts.t_max, "max_action_tokens": ts.max_action_tokens,
                  "max_context": ts.max_context, "map_size": ts.size, "temperature": args.temperature,
                  "repeats": args.repeats, "jax_backend": jax.default_backend(),
                  "loadavg_start": list(meter.start_sample.loadavg), "jax_matmul_peak_gflops": jax_peak}
        if not args.skip_env:
            result.update(bench_env(world, ts, args))
        jax_side, spec = {}, {"tokenizer_dir": os.path.join(d, "tokenizer"), "map_size": ts.size, "t_max": ts.t_max,
                              "max_action_tokens": ts.max_action_tokens, "max_context": ts.max_context,
                              "format_penalty": float(ts.env_params().format_penalty),
                              "temperature": args.temperature, "seed": args.seed, "repeats": args.repeats,
                              "matmul_n": args.matmul_n, "budgets": [ts.t_max] * args.batch, "shapes": {}}
        for name in shapes:
            jax_side[name], spec["shapes"][name] = bench_jax_shape(name, cfgs[name], world, ts, args, d)
        peer = run_peer_workers("experiments.bench_rollout", spec,
                                peer_settings(len(meter.cpus), threads=args.torch_threads))
    torch_peak = max(r["matmul_gflops"] for r in peer.values())
    peak = max(jax_peak, torch_peak)
    result.update(torch_matmul_peak_gflops=torch_peak, matmul_peak_gflops=peak)
    ratios = {}
    for name in shapes:
        r = finish_shape(name, jax_side[name], peer, args, peak)
        ratios[name] = r[f"{name}_rollout_ratio"]
        result.update(r)
    head = min(ratios, key=ratios.get)
    result["torch_threads"] = result[f"{head}_torch_threads"]
    result["omp_wait_policy"] = result[f"{head}_omp_wait_policy"]
    result["rollout_ratio"] = ratios[head]
    result.update(meter.fields())
    result["loadavg_end"] = list(os.getloadavg())
    ratio_keys = ["env_ratio", "env_text_obs_ratio", "rollout_ratio"] + [f"{n}_rollout_ratio" for n in shapes]
    flag_busy(result, ratio_keys)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
