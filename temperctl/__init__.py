"""temperctl: the command-line client of temperd (installed as the ``temperctl`` package)."""
