"""The repository stands on its own: no tracked file cites a document a user of the
repository does not have (the original product notes, their section numbers or their
behaviour catalogue), and every citation of docs/design.md names a section it has."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces so this file does not match itself.
OUTSIDE = [
    ("a section of the product spec", r"\b" + "SP" + r"EC\b|" + "\u00a7"),
    ("the original design notes", r"\bseeds/|\bseeds?: (?!tests/)|\bseed (?:doc|document|internals|performance)\b|the seed's"),
    ("the shared folder", r"\.\./" + "shared" + r"\b|\bshared/(?:SP" + r"EC|seeds|reference)"),
    ("the behaviour catalogue", r"\breference/behaviou?rs|\bbehaviou?rs (?:[A-Z]+-\d|\u00a7)|"
                                r"\b(?:PICK|OUT|SIG|INS|CHD|LSE|GC|FL|JOB|REG|TST|SCH|PK|PERF|MIG|AWR)-\d\d\b"),
    ("the style notes", r"\bST" + r"YLE(?:\.md| \")"),
]


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = ROOT / name
        if name == "tests/test_citations.py" or not path.is_file():
            continue
        try:
            yield name, path.read_text()
        except UnicodeDecodeError:  # images
            continue


def test_no_tracked_file_cites_a_document_outside_the_repository():
    found = []
    for name, text in tracked_text_files():
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE:
                if re.search(pattern, line):
                    found.append(f"{name}:{lineno}: cites {what}: {line.strip()[:120]}")
    assert not found, ("cite the repository's own docs (docs/design.md#…, docs/guide.md) instead:\n"
                       + "\n".join(found))


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")


def test_every_design_citation_names_an_existing_section():
    design = (ROOT / "docs" / "design.md").read_text()
    anchors = {_slug(m.group(1)) for m in re.finditer(r"^#{2,3} (.+)$", design, re.M)}
    missing = sorted({f"{name}: #{a}" for name, text in tracked_text_files()
                      for a in re.findall(r"docs/design\.md#([a-z0-9-]+)", text) if a not in anchors})
    assert not missing, "docs/design.md has no such section:\n" + "\n".join(missing)


def test_every_citation_of_another_doc_names_an_existing_section():
    """docs/guide.md#postgres-or-redis and the like (a check's hint, the README): the
    heading must exist, as GitHub slugs it."""
    missing = set()
    for name, text in tracked_text_files():
        for doc, anchor in re.findall(r"docs/([a-z_]+)\.md#([a-z0-9_-]+)", text):
            if doc == "design":
                continue  # the test above
            path = ROOT / "docs" / f"{doc}.md"
            headings = re.findall(r"^#{1,4} (.+)$", path.read_text(), re.M) if path.exists() else []
            if anchor not in {_github_slug(h) for h in headings}:
                missing.add(f"{name}: docs/{doc}.md#{anchor}")
    assert not missing, "no such section:\n" + "\n".join(sorted(missing))


def _github_slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")
