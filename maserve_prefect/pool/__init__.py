"""The heterogeneous-pool runtime (seed paper 001): plans that choose lifecycle, replica, device
and order together.

`state` / `snapshot` / `window` are what a pool plan sees; `fusion`, `constructor` and
`memory_ledger` build its options; `joint_plan` and `baselines` are the plans (registered with
`dispatch.plans` under their names); `control` keeps the books a pool plan decides on and applies
its lifecycle decisions; `handle` / `wall` reach simulated and real pools; `executor`, `inputs`,
`results`, `workload` and `costs` run recorded multi-agent work on a pool and measure it;
`lower_bound` is the offline bound no plan can beat.
"""
