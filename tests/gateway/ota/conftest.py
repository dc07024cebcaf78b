from __future__ import annotations

import pytest

from tests.support.releases import ReleaseKit


@pytest.fixture(scope="session")
def release_kit(tmp_path_factory: pytest.TempPathFactory) -> ReleaseKit:
    """One key pair and its releases for the whole session (releases are read-only)."""
    return ReleaseKit(tmp_path_factory.mktemp("releases"))
