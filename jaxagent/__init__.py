"""jaxagent: multi-turn agentic RL for LLM agents in JAX (docs/api.md: the public API with runnable examples).

Subpackages, each importing only those before it: `models` (Qwen3), `sharding` (the mesh and its rules table),
`sampling` (generate, decode), `envs` (jittable and host environments), `rollout` (multi-turn episodes), `rl`
(advantages, losses, train step), `eval` (Pass@(K,T) and the diagnostics), `study` (the study's stages).
"""
