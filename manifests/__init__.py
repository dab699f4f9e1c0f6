"""The manifests (models, datasets, scenarios as YAML) and the one layer that reads them: `include:`
(yaml_io), the model/dataset tables (catalog), scenario files (scenario) and the config validator every
stage uses (validate). It imports no stage: extract, store, train and evaluate all stand on it."""
