"""The library's own dependencies: what the example project needs stays in its extra."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_django_environ_is_an_example_extra_not_a_library_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("django-environ")]
    assert any(d.startswith("django-environ") for d in project["optional-dependencies"]["example"])
    for script in ("scripts/bootstrap", ".ci/run"):
        assert "example" in (ROOT / script).read_text().split("pip install", 1)[1], script


def test_every_install_hint_names_an_extra_the_package_declares():
    """An ImportError's hint (conf.install_hint) tells a user to install an extra by name:
    each name the library passes it must be one pyproject.toml declares, or the hinted
    command fails (pip warns "does not provide the extra" and installs nothing)."""
    import re

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {m.group(1) for path in (ROOT / "gen_durable").rglob("*.py")
             for m in re.finditer(r"""install_hint\(["'](\w+)["']\)""", path.read_text())}
    assert named >= {"prometheus", "tasks", "redis", "otel"}  # the calls this test is about were found
    assert named <= set(extras), f"hinted but not declared: {sorted(named - set(extras))}"
