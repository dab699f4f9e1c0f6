"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes."""
