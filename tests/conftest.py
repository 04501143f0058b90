"""Shared pytest set-up: markers and small fixtures."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real: uses real packaged model weights (slower)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds even when cached")
    config.addinivalue_line("markers", "browser: drives Debian's chromium through Playwright")
