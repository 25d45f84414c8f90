"""Keeps the API reference in step with the code: every name `gen_durable.__all__`
exports must be documented in reference/api.rst (a warning, an error under -W), so a
new or renamed public name breaks the docs build until the reference follows."""

import re
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)


def check_public_api(app):
    import gen_durable

    text = (Path(app.srcdir) / "reference" / "api.rst").read_text()
    documented = set(re.findall(r"^\.\. auto(?:function|class|exception|data):: gen_durable\.(\w+)\s*$", text, re.M))
    for name in sorted(set(gen_durable.__all__) - documented):
        logger.warning("gen_durable.%s is public (gen_durable.__all__) but not in reference/api.rst", name)
    for name in sorted(documented - set(gen_durable.__all__)):
        logger.warning("reference/api.rst documents gen_durable.%s, which gen_durable.__all__ does not export", name)


def check_settings_and_checks(app):
    """Every GEN_DURABLE key and every system-check id must appear in the guide's tables."""
    from gen_durable import checks
    from gen_durable.conf import DEFAULTS

    guide = (Path(app.srcdir) / "guide.md").read_text()
    table = guide[guide.index("<!-- settings-reference-start -->"):guide.index("<!-- settings-reference-end -->")]
    for key in DEFAULTS:
        if f"`{key}`" not in table:
            logger.warning("GEN_DURABLE[%r] is not in guide.md's settings table", key)
    source = Path(checks.__file__).read_text()
    for check_id in sorted(set(re.findall(r'ID \+ "([EW]\d{3})"', source))):
        if f"`{check_id}`" not in table and f"gen_durable.{check_id}" not in table:
            logger.warning("system check %s is not in guide.md's table of checks", check_id)


def write_generated(app):
    """reference/generated/: the management commands' --help and the telemetry events,
    from the code itself."""
    import inspect

    from django.core.management import get_commands, load_command_class

    from gen_durable import telemetry

    out = Path(app.srcdir) / "reference" / "generated"
    out.mkdir(exist_ok=True)
    parts = ["# Management commands\n\n",
             "Run from your project (`python manage.py …`). Generated from each command's parser.\n"]
    for name, app_name in sorted(get_commands().items()):
        if app_name != "gen_durable":
            continue
        command = load_command_class(app_name, name)
        parser = command.create_parser("manage.py", name)
        parts.append(f"\n## `{name}`\n\n{inspect.cleandoc(command.help or '')}\n\n```text\n"
                     f"{parser.format_help()}```\n")
    _write(out / "commands.md", "".join(parts))
    doc = inspect.getdoc(telemetry)
    _write(out / "telemetry.md", "# Telemetry events\n\nGenerated from `gen_durable.telemetry`.\n\n"
           + doc.split("\n", 1)[1].replace("\n    from gen_durable", "\n```python\nfrom gen_durable", 1)
           .replace("    telemetry.attach(", "telemetry.attach(", 1).replace("...)\n", "...)\n```\n", 1) + "\n")


FIELD = re.compile(r"^[A-Za-z_][\w ,/()`*=.-]{0,40}:\s")


def plain_docstring(app, what, name, obj, options, lines):
    """The package's docstrings are plain text: `field: description` lines whose
    continuations are indented. Join each continuation to its line and give each field
    a paragraph of its own, so reStructuredText reads them as written."""
    out = []
    for line in lines:
        if line[:1] in (" ", "\t") and out and out[-1].strip() and not out[-1].rstrip().endswith("::"):
            out[-1] = out[-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    spaced = []
    for line in out:
        if FIELD.match(line) and spaced and spaced[-1].strip():
            spaced.append("")
        spaced.append(line)
    lines[:] = spaced


def _write(path, text):
    if not path.exists() or path.read_text() != text:  # unchanged: no rebuild
        path.write_text(text)


def setup(app):
    app.connect("autodoc-process-docstring", plain_docstring)
    app.connect("builder-inited", write_generated)
    app.connect("builder-inited", check_public_api)
    app.connect("builder-inited", check_settings_and_checks)
    return {"parallel_read_safe": True}
