"""The house a newcomer reads: folders by stage, small modules, no import cycle, no ``gateway``.

These hold the layout docs/architecture.md describes; each fails with what to change.
"""

from __future__ import annotations

import ast

from tests.architecture.imports import PACKAGE_DIR, cycles, graph, modules

MAX_MODULE_LINES = 500
MAX_ROOT_MODULES = 8  # __init__, __main__ and a few cross-cutting primitives


def test_no_import_cycle_inside_the_package() -> None:
    found = cycles(graph())
    assert not found, (
        "import cycles (each group imports itself through the others; move the shared part "
        f"into a module both can import): {found}"
    )


def test_the_cycle_finder_sees_a_cycle(tmp_path) -> None:
    """The check above can fail: two modules that import each other are a cycle."""
    package = tmp_path / "tesla_gateway"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from tesla_gateway.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (package / "c.py").write_text("import tesla_gateway.a\n")
    assert cycles(graph(package)) == [["tesla_gateway.a", "tesla_gateway.sub.b"]]


def test_no_module_over_500_lines() -> None:
    long = {
        name: count
        for name, module in modules().items()
        if (count := len(module.path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by responsibility): {long}"


def test_the_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"tesla_gateway/ root modules: {root}"


def test_every_folder_says_its_job_in_one_line() -> None:
    for init in sorted(PACKAGE_DIR.glob("*/__init__.py")):
        if init.parent.name in {"default_models", "examples"}:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init} has no docstring saying the folder's job"
        assert len(doc.splitlines()[0]) <= 100, f"{init}: first line too long"


def test_nothing_is_named_gateway_at_the_top() -> None:
    """The import package is the distribution's name; a top-level ``gateway`` collides."""
    assert not (PACKAGE_DIR.parent / "gateway").exists()


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def test_only_the_entry_point_imports_the_daemon() -> None:
    """``daemon/`` composes the stages; a stage that imported it would reach back into the root."""
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph().items()
        for target in targets
        if _folder(target) == "daemon"
        and _folder(module) != "daemon"
        and module not in {"tesla_gateway.__main__", "tesla_gateway.daemon"}
    )
    assert not offenders, f"imports of daemon/ from the stages: {offenders}"


def test_the_contract_stands_alone() -> None:
    """training/ imports contract/: it may need nothing of the daemon's but the root primitives."""
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph().items()
        if _folder(module) == "contract"
        for target in targets
        if _folder(target) not in {"", "contract"}
    )
    assert not offenders, f"contract/ imports other folders: {offenders}"


def test_the_daemon_loads_aiohttp_only_when_a_listener_or_fleet_client_runs() -> None:
    """aiohttp costs about 20 MiB resident: a gateway without the sensor.community or PurpleAir
    source and without /metrics must not pay it (the footprint target is 120 MB at 10,000)."""
    import subprocess
    import sys

    probe = (
        "import sys, tesla_gateway.daemon.cli, tesla_gateway.daemon.service, "
        "tesla_gateway.daemon.config, tesla_gateway.sources.fleet; "
        "print('aiohttp' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
