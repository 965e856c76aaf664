"""Loading a skill from a directory: ``skill.json`` or an Agent Skills ``SKILL.md``.

* ``skill.json`` (the project's own manifest): a JSON object with ``name``,
  ``system_prompt_file`` (a path relative to the directory), optional
  ``context_file`` (a JSON file, the context data), optional ``mcp_servers``
  (a list of :class:`~smith_worker.mcp.ServerConfig` fields) and optional
  ``description``. Other keys are refused, so a misspelt one is not ignored.
* ``SKILL.md`` (https://agentskills.io/specification): YAML front matter
  between ``---`` lines holding ``name`` and ``description`` (other fields such
  as ``license`` or ``metadata`` are accepted and ignored), then the
  instructions, which become the system prompt; an optional ``context.json``
  beside it is the context data.

Native tools are not loaded from files (no executable code from
data files, docs/architecture.md, Skills); register them in code with :class:`~smith_worker.skills.Skill`.
Every problem raises :class:`SkillError` naming the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from smith_client.errors import SkillError
from smith_worker.skills.model import DEFAULT_SKILL_CONTEXT_MAX_BYTES, Skill

MANIFEST = "skill.json"
SKILL_MD = "SKILL.md"
#: The context data file beside a ``SKILL.md``.
SKILL_MD_CONTEXT = "context.json"


class Manifest(BaseModel):
    """The fields of a ``skill.json``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    system_prompt_file: str
    context_file: str | None = None
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    description: str = ""


class FrontMatter(BaseModel):
    """The fields of a ``SKILL.md`` front matter used here (Agent Skills: ``description`` is 1-1024 characters)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str = Field(min_length=1, max_length=1024)


def load_skill(path: str | Path, *, context_max_bytes: int = DEFAULT_SKILL_CONTEXT_MAX_BYTES) -> Skill:
    """Read the skill in directory ``path`` (see the module doc); a path to its ``skill.json`` or
    ``SKILL.md`` names the same directory.

    ``context_max_bytes`` caps the serialized context data (UTF-8 bytes). Raises :class:`SkillError` for a
    missing directory or file, a directory holding both formats or neither,
    bad JSON, bad front matter, a missing or wrong field, an invalid MCP server
    config, a bad name or oversized context data.
    """
    directory = Path(path)
    if directory.name in (MANIFEST, SKILL_MD) and directory.is_file():
        directory = directory.parent
    if not directory.is_dir():
        raise SkillError(f"{directory}: not a skill directory")
    manifest, skill_md = directory / MANIFEST, directory / SKILL_MD
    if manifest.is_file() and skill_md.is_file():
        raise SkillError(f"{directory}: holds both {MANIFEST} and {SKILL_MD}; keep one")
    if manifest.is_file():
        skill = _load_manifest(manifest)
    elif skill_md.is_file():
        skill = _load_skill_md(skill_md)
    else:
        raise SkillError(f"{directory}: holds neither {MANIFEST} nor {SKILL_MD}")
    skill.check_context(context_max_bytes)
    return skill


def _load_manifest(file: Path) -> Skill:
    raw = _parse_json(file)
    if not isinstance(raw, dict):
        raise SkillError(f"{file}: must hold a JSON object, got {type(raw).__name__}")
    fields = _validate(Manifest, raw, file)
    prompt = _read_text(_inside(file.parent, fields.system_prompt_file, file)).strip()
    context = _parse_json(_inside(file.parent, fields.context_file, file)) if fields.context_file else None
    return _build(
        file,
        name=fields.name,
        system_prompt=prompt,
        context_data=context,
        mcp_servers=fields.mcp_servers,
        description=fields.description,
    )


def _load_skill_md(file: Path) -> Skill:
    header, body = _split_front_matter(file, _read_text(file))
    try:
        data = yaml.safe_load(header)
    except yaml.YAMLError as exc:
        raise SkillError(f"{file}: front matter is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SkillError(f"{file}: front matter must be a mapping with name and description")
    fields = _validate(FrontMatter, data, file)
    context_file = file.parent / SKILL_MD_CONTEXT
    context = _parse_json(context_file) if context_file.is_file() else None
    return _build(file, name=fields.name, system_prompt=body, context_data=context, description=fields.description)


def _split_front_matter(file: Path, text: str) -> tuple[str, str]:
    """``(yaml, body)`` of a ``SKILL.md``: the front matter opens on the first line and closes at a ``---`` line."""
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillError(f"{file}: must start with YAML front matter (a '---' line)")
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :]).strip()
    raise SkillError(f"{file}: front matter is not closed by a '---' line")


def _build(file: Path, **fields: Any) -> Skill:
    try:
        return Skill(**fields)
    except SkillError as exc:  # name the file the bad value came from
        raise SkillError(f"{file}: {exc.message}", skill_name=str(getattr(exc, "skill_name", ""))) from exc


def _validate(model: type[BaseModel], raw: dict[str, Any], file: Path) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        raise SkillError(f"{file}: {problems}", skill_name=str(raw.get("name", ""))) from exc


def _inside(directory: Path, relative: str, manifest: Path) -> Path:
    """``directory / relative``, refused when it leaves the skill's directory."""
    target = (directory / relative).resolve()
    if not target.is_relative_to(directory.resolve()):
        raise SkillError(f"{manifest}: {relative!r} points outside the skill directory")
    return target


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SkillError(f"{file}: file not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillError(f"{file}: cannot be read as UTF-8 text: {exc}") from exc


def _parse_json(file: Path) -> Any:
    try:
        return orjson.loads(_read_text(file))
    except orjson.JSONDecodeError as exc:
        raise SkillError(f"{file}: invalid JSON: {exc}") from exc
