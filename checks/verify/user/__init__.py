"""``invoke verify -- COMMAND``: the user's own training command, unchanged, under torch's global hooks."""
