"""Adaptive temperature scaling of each agent's option distribution."""
