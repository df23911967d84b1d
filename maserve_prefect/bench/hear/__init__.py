"""maserve_prefect.bench.hear: the HEAR experiments as suites (SCBench, Mooncake, role -> mode).

One idea: HEAR policies (`hear/`) stay pure; `adapters` glues them onto the session-replay driver
(`workloads/`) and times the glue as control-plane overhead; `arms` runs one policy arm; each
experiment (`suite_file`: one `kind: hear` model per `experiment`) records its workload once and
replays it identically per policy arm; `tables` turns the runs into rows laid out like the paper's.
"""
