"""The jitted multi-turn rollout without the CPU kernels: XLA:CPU's branches (JAXAGENT_CPU_KERNELS=0)
and the branches GPUs and TPUs compile (lax.switch KV windows, dot_general attention), run on CPU.
Its sampler logprobs equal a teacher-forced forward over the whole context (tests/test_rollout.py
checks the same with the kernels).

Legend: B episodes, S context slots.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams, sample_tasks
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import build_word_tokenizer
from jaxagent.rollout import RolloutConfig, budget_format, chat_layout, env_codec, rollout
from jaxagent.sampling import Sampler

B, T_MAX = 4, 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = build_word_tokenizer(FrozenLake.vocabulary(), tmp_path_factory.mktemp("tok"))
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=True)
    env = FrozenLake(codec, size=4)
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    act_ids = [tok.encode(a)[0] for a in FrozenLake.ACTION_STRINGS] + [tok.im_end_id]
    params["embed"] = params["embed"].at[jnp.asarray(act_ids)].multiply(40.0)  # episodes that move
    rcfg = RolloutConfig(t_max=T_MAX, max_action_tokens=6, max_context=256, sampler=Sampler(temperature=1.0))
    return dict(env=env, layout=chat_layout(tok, FrozenLake.system_prompt()), fmt=budget_format(codec), cfg=cfg,
                params=params, rcfg=rcfg, env_params=FrozenLakeParams(horizon=T_MAX))


@pytest.mark.slow
@pytest.mark.parametrize("seam", ["cpu_xla", "accelerator"], indirect=True)
def test_sampler_logprobs_equal_teacher_forced(setup, seam):
    s = setup
    r = rollout(s["params"], s["cfg"], s["env"], s["layout"], s["fmt"], sample_tasks(jax.random.key(0), B, 4, 0.8),
                np.array([1, 2, 3, 3]), jax.random.key(1), s["env_params"], s["rcfg"])
    assert (np.asarray(r.turns_used) >= 1).all()
    logits, _ = jax.jit(qwen3.forward, static_argnums=1)(s["params"], s["cfg"], r.tokens)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nxt = jnp.take_along_axis(logp[:, :-1], r.tokens[:, 1:, None], axis=-1)[..., 0]
    mask = np.asarray(r.policy_mask)[:, 1:]
    diff = np.abs(np.asarray(nxt) - np.asarray(r.logprobs)[:, 1:])[mask]
    assert mask.sum() > 10 and diff.max() < 1e-4
