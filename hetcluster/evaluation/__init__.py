"""The ground truth: train every configuration for real and score the planner's choices against it.

``scoring`` is pure (which configuration was best by measurement, regret, MAPE); ``harness`` runs
the configurations on the fleet, each from a copy of the same pre-training checkpoint.
"""
