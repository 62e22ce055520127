"""The PyTorch + gymnasium peer of `jaxagent.bench.rollout` (`python -m experiments.bench_rollout`; the module
docstring there describes both sides): gymnasium's FrozenLake vector env for env stepping, and the multi-turn
rollout a PyTorch + gymnasium implementation runs (`torch_rollout`), timed in worker processes
(`workers.run_peer_workers`) at each torch thread count and OpenMP wait policy; `replay` feeds JAX's replies through
it in this process (untimed)."""
from __future__ import annotations

import re
import statistics
import time

import numpy as np

from experiments.peers.workers import run_peer_workers, torch_matmul_gflops
from jaxagent.bench.harness import time_call
from jaxagent.bench.rollout import tokens_processed
from jaxagent.envs.jax import frozenlake as fl
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.budgets import DEFAULT_TEMPLATE
from jaxagent.rollout import types
from jaxagent.rollout.jax_loop import RolloutConfig
from jaxagent.study.toy import ToyWorld, make_toy_world

_ACTION_RE = re.compile(r"<answer>(Left|Down|Right|Up)</answer>")


def gym_desc(map_LxL) -> list[str]:
    """Our int8 cell codes (frozenlake_solver: FROZEN 0, HOLE 1, START 2, GOAL 3) as gymnasium 'SFHG' rows."""
    return ["".join(fl.CELL_WORDS[int(c)] for c in row) for row in np.asarray(map_LxL)]


class HostText:
    """Host-side pieces of the episode layout for the PyTorch loop: the same token pieces and the same
    words as jaxagent's in-graph `episode.prompt_chunk` / `FrozenLake._observe`, as text encoded by the tokenizer."""

    MESSAGES = tuple(" ".join(m) for m in fl.MESSAGES)

    def __init__(self, world: ToyWorld):
        lay = world.layout
        self.system, self.first_open, self.next_open = list(lay.system), list(lay.first_open), list(lay.next_open)
        self.close, self.stop_ids, self.pad_id = list(lay.close), tuple(lay.stop_ids), lay.pad_id
        self.end_of_turn = lay.end_of_turn
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

    def chunks(self, t: int, budgets, texts: list[str], closed: list[bool]) -> list[list[int]]:
        """Per episode: [turn opener] + tokens(budget text + observation) + [close]; after a reply that did not
        end with <|im_end|> (`closed` False: cut at max_action_tokens) the opener starts with it, as jaxagent's
        `episode.prompt_chunk` does."""
        full = [self.template.format(turn=t + 1, budget=b, remaining=b - t) + " " + o for b, o in zip(budgets, texts)]
        encoded = self.backend.encode_batch(full, add_special_tokens=False)
        return [self.opener(t, c) + e.ids + self.close for e, c in zip(encoded, closed)]

    def opener(self, t: int, closed: bool) -> list[int]:
        if t == 0:
            return self.first_open
        return self.next_open if closed else [self.end_of_turn] + self.next_open

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
    closed = [True] * n_ep  # the last reply ended with <|im_end|> (else the next chunk starts with it)
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
                                 [host.observation(descs[b], pos[b], msg[b]) for b in cand], [closed[b] for b in cand])
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
                closed[b] = bool(r) and r[-1] == host.end_of_turn
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


def _torch_model(model_dir: str):
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def peer_worker(spec: dict, threads: list[int]) -> dict:
    """Worker side (run by `workers`): per thread count, the torch matmul peak and, per shape, the
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

            warm_s = time_call(run)
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


def gym_vector(maps_ExLxL, seed: int, steps: int) -> tuple:
    """gymnasium's `SyncVectorEnv` of FrozenLake-v1 on our maps (deterministic moves), reset with `seed`:
    (run: `steps` vector steps of uniformly random actions, the number of envs, close)."""
    import gymnasium as gym
    from gymnasium.vector import SyncVectorEnv

    descs = [gym_desc(m) for m in maps_ExLxL]
    venv = SyncVectorEnv([lambda d=d: gym.make("FrozenLake-v1", desc=d, is_slippery=False) for d in descs])
    venv.reset(seed=seed)
    rng = np.random.default_rng(seed)

    def run():
        for _ in range(steps):
            venv.step(rng.integers(0, fls.N_ACTIONS, len(descs)))

    return run, len(descs), venv.close


def replay(model_dir: str, world: ToyWorld, tasks, budgets, jx, rcfg: RolloutConfig, temperature: float) -> dict:
    """`replay_check` of JAX's rollout `jx` with the model at `model_dir`, in this process at one torch thread (it is
    untimed; the timed peer runs in workers)."""
    import torch

    torch.set_num_threads(1)
    return replay_check(_torch_model(model_dir), HostText(world), make_gym_envs(tasks), budgets, jx, rcfg, temperature)


def run_peer(spec: dict, settings) -> dict:
    """The peer's rollout results per setting (`peer_worker` in worker processes)."""
    return run_peer_workers("experiments.peers.torch_rollout", spec, settings)
