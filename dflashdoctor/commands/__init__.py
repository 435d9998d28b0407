"""One module per command: options in, a finished Report out. The CLI only wires flags to these."""
