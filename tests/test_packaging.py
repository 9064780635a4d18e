"""The installed environment: nothing else answers to our packages' import names."""

import importlib.metadata

import pytest

OUR_DISTRIBUTION = "prefixchat"


@pytest.mark.parametrize("package", ["chatapp", "inference", "kernels", "bench"])
def test_no_other_distribution_provides_our_top_level_package(package: str) -> None:
    # A dependency that installs a module of the same name is shadowed by ours (or
    # shadows it), and code importing the other one breaks in confusing ways.
    others = set(importlib.metadata.packages_distributions().get(package, [])) - {OUR_DISTRIBUTION}
    assert not others, (
        f"installed distribution(s) {sorted(others)} also provide `{package}`; "
        "pin the dependency that pulls them in (see pyproject.toml)"
    )


def test_the_c_kernel_sources_ship_with_the_package():
    # Compiled on first use from the installed package: a source or header left out
    # of the wheel would make every non-editable install fall back to torch ops.
    import fnmatch
    import tomllib
    from pathlib import Path

    from kernels import cpu_kernels, f32_kernels

    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    globs = globs["package-data"]["kernels"]
    package = Path(cpu_kernels.__file__).parent
    for lib in (cpu_kernels, f32_kernels):
        for path in lib.SOURCES + lib.HEADERS:
            name = path.relative_to(package).as_posix()
            # fnmatch's * crosses "/": compare directory by directory.
            assert any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/")
                       for g in globs), name


def test_bench_stays_out_of_the_wheel():
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    found = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any(p.startswith("bench") for p in found["include"])
