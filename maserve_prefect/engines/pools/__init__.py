"""Shipped pool files."""
