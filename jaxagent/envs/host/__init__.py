"""The host (Python) world: the host env interface (`base`), SQL, sandboxed code (`sandbox` and its child
program `sandbox_child`), BFCL v4 (`bfcl_env`, its call handling `bfcl_calls`, its state handling
`bfcl_state`), the task records of SQL and code (`tasks`) and the task data (`data`)."""
