"""The repository stands alone: its docs name every module, and its comments cite only its docs.

Someone holding only this repository must be able to follow every reference a comment makes,
and find every module of ``txbroker/`` in ``docs/architecture.md``.  Both lists are read from
the file system, so a module added, moved or renamed without its row fails here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"
PROTOCOL = REPO / "docs/protocol.md"
#: Folders whose comments and docstrings are checked.
SOURCE_DIRS = ("txbroker", "cli", "bench", "tests", "examples")

_PACKAGE_IN_HEADING = re.compile(r"`txbroker/([\w/]+?)/?`")
_ROW_MODULE = re.compile(r"^\|\s*`([\w/]+\.py)`\s*\|", re.MULTILINE)
_MD_CITATION = re.compile(r"[\w./-]*\w\.md\b")
_PROTOCOL_SECTION = re.compile(r"docs/protocol\.md,?\s+§(\d+)(?:\.(\d+))?")


def module_files() -> list[str]:
    """Every module under ``txbroker/``, as a path from the repository root.

    ``__init__.py`` files are left out: a package is described by its section, and what its
    ``__init__`` re-exports is listed there (the SDK's public names).
    """
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "txbroker").rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def documented_modules(text: str) -> set[str]:
    """Modules named in a table row of the architecture page, as paths from the repo root.

    A row names its module relative to the package its ``##`` section is about (``record.py``
    under "Store (`txbroker/store/`)", ``processors/send.py`` under the service section), or
    by its full path (``txbroker/config.py``).
    """
    found: set[str] = set()
    for section in re.split(r"^## ", text, flags=re.MULTILINE):
        heading = section.split("\n", 1)[0]
        match = _PACKAGE_IN_HEADING.search(heading)
        package = f"txbroker/{match.group(1)}/" if match else None
        for name in _ROW_MODULE.findall(section):
            if name.startswith("txbroker/"):
                found.add(name)
            elif package is not None:
                found.add(package + name)
    return found


def comment_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a Python file."""
    source = path.read_text(encoding="utf-8")
    texts = [(tok.start[0], tok.string)
             for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                texts.append((doc.lineno, doc.value.value))
    return texts


def source_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py")
                  if "__pycache__" not in p.parts)


def missing_citations() -> list[str]:
    """``file:line: name`` for each ``.md`` a comment cites that is not a file in the repo."""
    bad = []
    for path in source_files():
        for line, text in comment_texts(path):
            for name in _MD_CITATION.findall(text):
                target = (REPO / name).resolve()
                if not target.is_relative_to(REPO) or not target.is_file():
                    bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return bad


def protocol_sections(text: str) -> set[tuple[str, str | None]]:
    """Sections of docs/protocol.md a citation may name: ``## N.``, ``### N.M`` and the
    numbered items ``M.`` of a section that is a list (section 8, what real clients do)."""
    sections: set[tuple[str, str | None]] = set()
    current = None
    for line in text.splitlines():
        if m := re.match(r"## (\d+)\. ", line):
            current = m.group(1)
            sections.add((current, None))
        elif m := re.match(r"### (\d+)\.(\d+) ", line):
            sections.add((m.group(1), m.group(2)))
        elif current is not None and (m := re.match(r"(\d+)\. \*\*", line)):
            sections.add((current, m.group(1)))
    return sections


def test_every_txbroker_module_is_in_architecture_md() -> None:
    documented = documented_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = [m for m in module_files() if m not in documented]
    assert not missing, f"modules without a row in docs/architecture.md: {missing}"


def test_architecture_md_names_no_module_that_is_gone() -> None:
    documented = documented_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    gone = sorted(m for m in documented if not (REPO / m).is_file())
    assert not gone, f"docs/architecture.md has rows for modules that do not exist: {gone}"


def test_comments_cite_only_md_files_in_the_repository() -> None:
    bad = missing_citations()
    assert not bad, ("comments cite documents that are not in the repository (write the path "
                     "from the repo root, e.g. docs/protocol.md):\n" + "\n".join(bad))


def test_protocol_md_citations_name_existing_sections() -> None:
    sections = protocol_sections(PROTOCOL.read_text(encoding="utf-8"))
    bad = []
    for path in source_files():
        for line, text in comment_texts(path):
            for major, minor in _PROTOCOL_SECTION.findall(" ".join(text.split())):
                if (major, minor or None) not in sections:
                    bad.append(f"{path.relative_to(REPO)}:{line}: §{major}{'.' + minor if minor else ''}")
    assert not bad, "comments cite sections docs/protocol.md does not have:\n" + "\n".join(bad)


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The parsers above find a bare or outside citation, a relative row and a full-path row."""
    src = tmp_path / "m.py"
    src.write_text('"""See notes.md and ../elsewhere/guide.md."""\n# docs/protocol.md §1\nx = "a.md"\n')
    cited = [n for _, t in comment_texts(src) for n in _MD_CITATION.findall(t)]
    assert cited == ["docs/protocol.md", "notes.md", "../elsewhere/guide.md"]
    assert not (REPO / "notes.md").is_file()
    assert not (REPO / "../elsewhere/guide.md").resolve().is_relative_to(REPO)
    doc = ("| `txbroker/config.py` | x |\n## Store (`txbroker/store/`)\n| `record.py` | y |\n"
           "## Service (`txbroker/service/`)\n| `processors/send.py` | z |\n")
    assert documented_modules(doc) == {"txbroker/config.py", "txbroker/store/record.py",
                                       "txbroker/service/processors/send.py"}
