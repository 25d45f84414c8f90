"""Sphinx configuration of gen_durable's documentation site (scripts/docs builds it)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports the package: a minimal Django configuration, no database connection.
import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django.contrib.admin",
                        "gen_durable"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "docs"}},
        USE_TZ=True,
    )
    django.setup()

import gen_durable  # noqa: E402

project = "gen_durable"
author = "gen_durable contributors"
release = os.environ.get("GEN_DURABLE_VERSION", "0.1.0")
extensions = ["myst_parser", "sphinx.ext.autodoc", "gen_durable_docs"]
sys.path.insert(0, str(Path(__file__).parent / "_ext"))
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "img/**/*.md"]
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
html_theme = "furo"
html_title = "gen_durable"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
nitpicky = False
# The pages link to the repository's own files (ARCHITECTURE.md, bench/, example_project/):
# those are not part of the site.
suppress_warnings = ["myst.xref_missing"]
