"""Interoperability: the project's traces in and out of the ecosystem's formats (AIPerf, OTel)."""
