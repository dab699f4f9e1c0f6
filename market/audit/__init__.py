"""The ledger audit: stored values, the state rebuilt from events, the heads outside the database."""
