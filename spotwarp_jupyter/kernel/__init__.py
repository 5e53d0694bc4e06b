"""The IPython side of SpotWarp: the `%spotwarp` magic and the kernel's session."""
