"""Workload specs of the shipped workflows (YAML)."""
