"""`python -m specviz …`: the command line (all of it lives in specviz/cli.py)."""

from specviz.cli import main

raise SystemExit(main())
