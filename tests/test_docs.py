"""The documentation holds: every relative link in README.md and docs/ resolves (file and heading),
and docs/configuration.md lists exactly the keys the config models define, each with its default."""

from __future__ import annotations

import re
import types
import typing
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import yaml
from pydantic import BaseModel
from trispec.config import SpecDecConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DOC = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 250


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# --- markdown: headings, anchors, links ------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a fence closes on the same character, at least as long)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text lowercased, every character
    that is not a letter, mark, digit, `_`, `-` or space dropped, each space turned into `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images → their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    keep = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN" or cat == "Pc":
            keep.append("-" if ch == " " else ch)
    return "".join(keep)


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (repeats get -1, -2, ...) and explicit
    ``<a name=...>`` / ``id=...`` anchors."""
    seen: dict[str, int] = {}
    found = set()
    lines = prose_lines(path.read_text())
    for line in lines:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if m:
            slug = github_slug(m.group(1).strip())
            n = seen.get(slug, 0)
            found.add(slug if n == 0 else f"{slug}-{n}")
            seen[slug] = n + 1
    for line in lines:
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return found


CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)


def link_targets(path: Path) -> list[str]:
    prose = CODE_SPAN.sub("code", "\n".join(prose_lines(path.read_text())))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def broken_link(source: Path, target: str) -> str | None:
    """Why a link from ``source`` does not resolve, or None (absolute URLs are not checked)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / unquote(file_part)).resolve() if file_part else source
    if not dest.exists():
        return f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
    if not anchor:
        return None
    if dest.suffix == ".md":
        return None if anchor in anchors(dest) else f"no heading with anchor #{anchor} in {dest.name}"
    if re.fullmatch(r"L\d+(-L\d+)?", anchor):  # GitHub's line anchors on source files
        return None
    return f"#{anchor} on a file that is not markdown"


def test_github_slugs_follow_githubs_rules() -> None:
    assert (
        github_slug("Tensors (compatible with `tensorrt_llm_bls`)")
        == "tensors-compatible-with-tensorrt_llm_bls"
    )
    assert github_slug("Engine (`make bench`)") == "engine-make-bench"
    assert github_slug("target and drafter.model") == "target-and-draftermodel"
    assert github_slug("SmolLM2-135M, adaptive k") == "smollm2-135m-adaptive-k"
    assert github_slug("Run it — fast → now, ≥ 2x") == "run-it--fast--now--2x"


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = []
    for path in doc_files():
        for target in link_targets(path):
            why = broken_link(path, target)
            if why:
                broken.append(f"{path.relative_to(ROOT)}: ({target}) → {why}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_checker_catches_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## A `code` heading\n\n```\n[not a link](nowhere.md)\n```\n")
    assert link_targets(page) == []
    assert broken_link(page, "#a-code-heading") is None
    assert broken_link(page, "page.md#page") is None
    assert "does not exist" in (broken_link(page, "other.md") or "")
    assert "no heading" in (broken_link(page, "page.md#a-code") or "")
    assert broken_link(page, "https://example.com/x#y") is None


def test_the_readme_stays_a_first_page() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = readme.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    )
    first_block = readme.split("```", 2)[1]
    assert "make serve" in first_block and "make test" in first_block, (
        "the first code block must show make serve and make test"
    )


# --- docs/configuration.md against the config models -----------------------------------------------

REQUIRED = object()


def section_models(annotation: object) -> list[type[BaseModel]]:
    """The config models inside a field's type (``X``, ``X | None``, ``Optional[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in section_models(arg)]
    return []


def model_keys(
    model: type[BaseModel], prefix: str = "", instance: BaseModel | None = None
) -> dict[str, object]:
    """Every leaf key under ``model``, dotted, with what a config that leaves it out gets: the value
    in the section's default (``kv_cache: {gpu_fraction: 0.85}``), else the field's default, else
    REQUIRED. A section (a field whose type is a model) contributes its keys, not itself."""
    keys: dict[str, object] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if instance is not None:
            value = getattr(instance, name)
        elif field.is_required():
            value = REQUIRED
        else:
            value = field.get_default(call_default_factory=True)
        sections = section_models(field.annotation)
        if sections:
            for section in sections:
                keys.update(model_keys(section, f"{key}.", value if isinstance(value, section) else None))
        else:
            keys[key] = value
    return keys


def documented_keys() -> dict[str, list[str]]:
    """Key → its default cells, from every table in docs/configuration.md whose first column is
    ``key`` (one row may name several keys that share a default and a meaning)."""
    documented: dict[str, list[str]] = {}
    header = None
    for line in prose_lines(CONFIG_DOC.read_text()):
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif header[:2] == ["key", "default"] and not set(cells[0]) <= set("-: "):
            for key in re.findall(r"`([^`]+)`", cells[0]):
                documented.setdefault(key, []).append(cells[1])
    return documented


def documented_default(cell: str) -> object:
    if cell.strip().lower() == "required":
        return REQUIRED
    m = re.fullmatch(r"`([^`]*)`", cell.strip())
    assert m, f"a default cell is one `yaml value` or the word required, not {cell!r}"
    return yaml.safe_load(m.group(1))


def plain(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


def as_yaml(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def same_default(doc: object, actual: object) -> bool:
    if doc is REQUIRED or actual is REQUIRED:
        return doc is actual
    if isinstance(doc, bool) or isinstance(actual, bool):  # `0` is not `false`
        return type(doc) is type(actual) and doc == actual
    return doc == actual  # 256 documents 256.0


def test_configuration_md_lists_exactly_the_config_keys() -> None:
    defined = model_keys(SpecDecConfig)
    documented = documented_keys()
    missing = sorted(set(defined) - set(documented))
    extra = sorted(set(documented) - set(defined))
    twice = sorted(k for k, cells in documented.items() if len(cells) > 1)
    problems = []
    if missing:
        problems.append("in config.py but not in docs/configuration.md:\n  " + "\n  ".join(missing))
    if extra:
        problems.append("in docs/configuration.md but not in config.py:\n  " + "\n  ".join(extra))
    if twice:
        problems.append("documented more than once:\n  " + "\n  ".join(twice))
    assert not problems, "\n".join(problems)


def test_configuration_md_gives_each_key_the_models_default() -> None:
    defined = model_keys(SpecDecConfig)
    wrong = []
    for key, cells in documented_keys().items():
        if key not in defined:
            continue  # reported by the test above
        doc = documented_default(cells[0])
        actual = plain(defined[key])
        if not same_default(doc, actual):
            shown = "required" if actual is REQUIRED else f"`{as_yaml(actual)}`"
            wrong.append(f"{key}: documented {cells[0]}, config.py gives {shown}")
    assert not wrong, "defaults in docs/configuration.md differ from config.py:\n  " + "\n  ".join(wrong)


def test_the_key_walk_reaches_nested_and_optional_sections() -> None:
    keys = model_keys(SpecDecConfig)
    assert {"scheduler.max_num_draft_tokens", "trtllm.chunked_context", "drafter.suffix.max_depth"} <= set(
        keys
    )
    assert keys["trtllm.kv_cache.gpu_fraction"] == 0.85 and keys["trtllm.kv_cache.gib"] is None
    assert keys["target.checkpoint.parts.sha256"] is REQUIRED
    assert "drafter.model.checkpoint.path" in keys and "target.checkpoint" not in keys
