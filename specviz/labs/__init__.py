"""One module per lab page, named like the page: its config, its job (a generator of Progress) and its result record."""
