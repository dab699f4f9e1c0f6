"""Feature sets: one (model, dataset, variant) extraction on disk, written and read here."""
