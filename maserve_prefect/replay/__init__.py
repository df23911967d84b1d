"""Fixed-work replay: scenarios, arrivals, release rules applied by the driver, arm runs.

`scenario` (YAML models) → `traceset` (cohorts merged, slots) → `arms.run_scenario` (deadlines
locked, paired blocks, one Prefect flow per arm) → `driver.replay_trace` (one replay through the
dispatcher on the simulator or a real engine; `release_driver` holds each op until its release
rule allows it) → `arm_summary` (measured roots, percentiles, deadline attainment) → `audit`
(the replay trace and its early-release audit). `work` says what an op replays (length / token
lock); `arrivals` when roots start.
"""
