"""temperd: per-thread-group CPU scheduling treatment for Linux hosts."""

__version__ = "0.1.0"
