"""Test helpers shared by the host env and expert tests: a tool-call message and an episode played from replies."""
from jaxagent.envs.host.bfcl_calls import format_tool_call


def call(name, **arguments):
    """One Qwen3 tool-call message calling `name` with `arguments`."""
    return format_tool_call(name, arguments)


def play(env, task, actions):
    """(final state, [(obs, reward, done, info)]) of `actions` played from a reset of `task`, stopping when done."""
    state, obs = env.reset(0, task)
    out = []
    for a in actions:
        state, obs, reward, done, info = env.step(state, a)
        out.append((obs, reward, done, info))
        if done:
            break
    return state, out
