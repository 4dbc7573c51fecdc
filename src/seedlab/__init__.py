"""seedlab: measured training-dynamics experiments, many seeds at once."""

__version__ = "0.1.0"
