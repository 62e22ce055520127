"""The accelerator benchmark's library (`experiments/bench_accel.py` is its command line): the device table
(`devices`), analytic FLOP and byte counts and roofline fractions (`roofline`), timing (`timing`), the model shapes
by the study's names (`models`), inputs (`data`), the measurements (`measure`), a timed RL iteration (`rl`), the
decode slots a rollout spends on finished episodes (`longtail`) and the roofline estimate tables (`estimates`)."""
