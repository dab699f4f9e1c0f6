"""The API's routers, one per resource (fastapi/full-stack-fastapi-template's api/routes): rounds, reports,
agents (accounts and the operator's overview). api/server.py mounts them."""
