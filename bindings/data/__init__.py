"""Shipped data files of the bindings (JSONL package data; see each binding module)."""
