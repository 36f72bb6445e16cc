"""The command line's files: outputs opened, locked, named and recorded."""
