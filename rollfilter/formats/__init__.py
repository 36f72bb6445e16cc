"""The formats nothing of the engine drives: what is read, written and kept on disk."""
