"""The market's HTTP API: app, dependencies, errors, typed models, guard, routes."""
