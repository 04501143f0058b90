"""Shared pytest set-up: markers and small fixtures."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real: uses real packaged model weights (slower)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds even when cached")
    config.addinivalue_line("markers", "browser: drives Debian's chromium through Playwright")


@pytest.fixture(scope="session")
def qwen_pair():
    """The default pair, loaded once for the whole run (a load takes about a minute): tests only read it."""
    from specviz.models import load_pair

    return load_pair("qwen-coder")
