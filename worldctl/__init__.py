"""worldctl, the command line: the top adapter over the library. Nothing imports it."""
