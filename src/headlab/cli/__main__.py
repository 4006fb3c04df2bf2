"""``python -m headlab.cli``: the command line."""

from headlab.cli import app

app()
