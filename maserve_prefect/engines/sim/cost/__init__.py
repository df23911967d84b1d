"""What a simulated engine step costs: the roofline step-time model and its calibration."""
