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
