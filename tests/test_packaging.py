"""The installed environment: nothing else answers to our packages' import names."""

import importlib.metadata

import pytest

OUR_DISTRIBUTION = "prefixchat"


@pytest.mark.parametrize("package", ["chatapp", "inference", "kernels"])
def test_no_other_distribution_provides_our_top_level_package(package: str) -> None:
    # A dependency that installs a module of the same name is shadowed by ours (or
    # shadows it), and code importing the other one breaks in confusing ways.
    others = set(importlib.metadata.packages_distributions().get(package, [])) - {OUR_DISTRIBUTION}
    assert not others, (
        f"installed distribution(s) {sorted(others)} also provide `{package}`; "
        "pin the dependency that pulls them in (see pyproject.toml)"
    )
