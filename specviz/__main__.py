"""`python -m specviz …`: the command line (it lives in the specviz/cli/ package: one module per command)."""

from specviz.cli import main

raise SystemExit(main())
