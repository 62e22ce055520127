"""The benchmarks' library (`experiments/bench_*.py` are their command lines, `experiments/peers/` the PyTorch and
gymnasium peers): what every benchmark shares (`harness`: the machine load and busy rule, the peer's settings, the
matmul peak, a checked throughput), the CPU comparisons (`model`, `train`, `rollout`) and the accelerator benchmark
(`accel`: its JAX stages; `accel_plan`: arguments and time budgets; `accel_peer`: the PyTorch peer's work list and
comparisons, without JAX; `accel_report`: progress lines and the targets; `accel_rl`: the RL iteration) with its
device table (`devices`), the chip's measured peaks (`peaks`), the train step's memory (`train_memory`), analytic
FLOP and byte counts and roofline fractions (`roofline`), timing (`timing`), the model shapes by the study's names
(`models`), inputs (`data`), the measurements (`measure`), a timed RL iteration (`rl`), the decode slots a rollout
spends on finished episodes (`longtail`) and the roofline estimate tables (`estimates`)."""
