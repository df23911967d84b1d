"""The simulator's engine side of HEAR: which controls a replica honours, cache controls, state."""
