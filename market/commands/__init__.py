"""The work of the market's commands, apart from their command lines."""
