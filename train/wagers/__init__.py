"""WALLA's wager heads and their batched, decentralized training."""
