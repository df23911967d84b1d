"""`SimPool`: simulated devices, the replicas placed on them, and their lifecycle on the clock."""
