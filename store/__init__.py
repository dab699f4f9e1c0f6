"""The feature store: fingerprints, atomic shard writes, verifying readers, scenario assembly."""
