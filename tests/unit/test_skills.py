"""Skills without Redis: loading both formats, every refusal, prompt composition, the active skills
of a step (their tools in a step's toolset: tests/unit/test_toolset.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smith_client.errors import ConfigurationError, SkillError
from smith_worker import Skill, SmithApp, load_skill, make_tool
from smith_worker.skills import ConversationSkills, compose_system_prompt, normalize_skill_name

SKILLS = Path(__file__).resolve().parents[1] / "support" / "skills"


def lookup(key: str) -> str:
    """Look a note up."""
    return key


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def manifest(**fields: object) -> str:
    import json

    return json.dumps({"name": "demo", "system_prompt_file": "prompt.md", **fields})


# ---- loading ------------------------------------------------------------------------------------


def test_skill_json_with_a_context_file_loads():
    skill = load_skill(SKILLS / "research")
    assert skill.name == "research" and skill.normalized_name == "research"
    assert skill.system_prompt == "Cite every source you use.\nPrefer primary sources."
    assert skill.context_data == {"sources": ["arxiv", "acl"], "max_results": 3}
    assert skill.context_json == '{"sources":["arxiv","acl"],"max_results":3}'
    assert skill.description == "Answer with cited sources."
    assert load_skill(SKILLS / "research" / "skill.json") == skill  # the manifest's path names its directory


def test_skill_md_front_matter_and_body_load(tmp_path):
    skill = load_skill(str(SKILLS / "pdf-tools"))
    assert (skill.name, skill.normalized_name) == ("pdf-tools", "pdf_tools")
    assert skill.description.startswith("Extract text and tables")
    assert skill.system_prompt == "# PDF tools\n\nAlways say which page a quote comes from."
    assert skill.context_data is None
    beside = write(tmp_path / "s", {"SKILL.md": "---\nname: s\ndescription: d\n---\nbody\n", "context.json": "[1, 2]"})
    assert load_skill(beside).context_data == [1, 2]


def test_server_configs_are_kept_as_given():
    from smith_worker.mcp import ServerConfig

    config = ServerConfig(alias="files", command="files-server")
    assert Skill("s", mcp_servers=[config]).servers == [config]


def test_skill_json_mcp_servers_become_server_configs(tmp_path):
    directory = write(tmp_path / "m", {
        "skill.json": manifest(mcp_servers=[{"alias": "files", "command": "files-server", "args": ["--ro"]}]),
        "prompt.md": "p",
    })
    (config,) = load_skill(directory).servers
    assert (config.alias, config.command, config.args) == ("files", "files-server", ("--ro",))


BAD_MANIFESTS = {
    "missing directory": (None, "not a skill directory"),
    "neither file": ({"README.md": "x"}, "holds neither skill.json nor SKILL.md"),
    "both formats": ({"skill.json": manifest(), "prompt.md": "p", "SKILL.md": "---\nname: a\n---\n"}, "holds both"),
    "bad json": ({"skill.json": '{"name": "demo",', "prompt.md": "p"}, "skill.json: invalid JSON"),
    "not an object": ({"skill.json": '["demo"]', "prompt.md": "p"}, "skill.json: must hold a JSON object"),
    "missing field": ({"skill.json": '{"name": "demo"}'}, "system_prompt_file: Field required"),
    "misspelt field": ({"skill.json": manifest(system_prompt="x"), "prompt.md": "p"}, "system_prompt: Extra inputs"),
    "wrong type": ({"skill.json": manifest(name=3), "prompt.md": "p"}, "name: Input should be a valid string"),
    "missing prompt file": ({"skill.json": manifest()}, "prompt.md: file not found"),
    "prompt outside": ({"skill.json": manifest(system_prompt_file="../x.md")}, "points outside the skill directory"),
    "bad context file": ({"skill.json": manifest(context_file="c.json"), "prompt.md": "p", "c.json": "{nope"},
                         "c.json: invalid JSON"),
    "missing context file": ({"skill.json": manifest(context_file="c.json"), "prompt.md": "p"}, "c.json: file not found"),
    "bad mcp server": ({"skill.json": manifest(mcp_servers=[{"alias": "Bad Alias", "command": "x"}]), "prompt.md": "p"},
                       "invalid MCP server 'Bad Alias'"),
    "unknown mcp field": ({"skill.json": manifest(mcp_servers=[{"alias": "a", "command": "x", "colour": 1}]),
                           "prompt.md": "p"}, "unexpected keyword argument 'colour'"),
    "bad name": ({"skill.json": manifest(name="-.-"), "prompt.md": "p"}, "normalizes to '___'"),
    "no front matter": ({"SKILL.md": "# Just markdown\n"}, "SKILL.md: must start with YAML front matter"),
    "unclosed front matter": ({"SKILL.md": "---\nname: a\ndescription: b\n"}, "front matter is not closed"),
    "bad yaml": ({"SKILL.md": "---\nname: [unclosed\n---\nbody\n"}, "front matter is not valid YAML"),
    "front matter not a mapping": ({"SKILL.md": "---\n- a\n- b\n---\n"}, "front matter must be a mapping"),
    "no description": ({"SKILL.md": "---\nname: a\n---\nbody\n"}, "description: Field required"),
    "empty name": ({"SKILL.md": "---\nname: ''\ndescription: d\n---\n"}, "name: String should have at least 1"),
    "bad context.json": ({"SKILL.md": "---\nname: a\ndescription: d\n---\n", "context.json": "{"},
                         "context.json: invalid JSON"),
    "not utf-8": ({"SKILL.md": None}, "cannot be read as UTF-8"),
}


@pytest.mark.parametrize("case", BAD_MANIFESTS, ids=list(BAD_MANIFESTS))
def test_bad_skill_directories_are_refused_naming_the_file_and_the_problem(tmp_path, case):
    files, problem = BAD_MANIFESTS[case]
    directory = tmp_path / "skill"
    if files == {"SKILL.md": None}:
        directory.mkdir()
        (directory / "SKILL.md").write_bytes(b"---\nname: \xff\n---\n")
    elif files is not None:
        write(directory, files)
    with pytest.raises(SkillError) as caught:
        load_skill(directory)
    assert problem in caught.value.message
    assert str(directory) in caught.value.message  # names the directory or the file in it


# ---- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, normalized", [("pdf-tools", "pdf_tools"), ("Web Search 2", "Web_Search_2"),
                                              ("a.b/c", "a_b_c"), ("_x", "_x"), ("résumé", "r_sum_")])
def test_names_normalize_to_a_tool_prefix(name, normalized):
    assert normalize_skill_name(name) == normalized
    assert Skill(name).normalized_name == normalized


@pytest.mark.parametrize("name", ["", "___", "-", "é. ", 7, "two\nlines", "x" * 201])
def test_names_that_cannot_prefix_tools_are_refused(name):
    with pytest.raises(SkillError):
        Skill(name)


def test_colliding_normalized_names_are_refused_at_registration():
    app = SmithApp()
    app.skill(Skill("pdf-tools"))
    with pytest.raises(ConfigurationError, match="'pdf-tools' and 'pdf_tools' both normalize to the tool prefix"):
        app.skill(Skill("pdf_tools"))
    with pytest.raises(ConfigurationError):
        app.skill(Skill("pdf-tools"))
    assert app.skills.names() == ["pdf-tools"]


def test_tool_names_are_checked():
    with pytest.raises(SkillError, match="two tools named 'lookup'"):
        Skill("s", tools=[lookup, make_tool(lookup)])
    with pytest.raises(SkillError, match="longer than 64"):
        Skill("s" * 60, tools=[lookup])
    with pytest.raises(SkillError, match="must be a callable or a Tool"):
        Skill("s", tools=["lookup"])
    with pytest.raises(SkillError, match="not JSON-able"):
        Skill("s", context_data={"when": object()})
    with pytest.raises(SkillError, match="must be a ServerConfig or a dict"):
        Skill("s", mcp_servers=["files"])


# ---- context size ---------------------------------------------------------------------------------


def test_oversized_context_is_refused_never_truncated(tmp_path):
    at_limit = {"k": "x" * (16 * 1024 - 8)}  # {"k":"..."} is exactly 16 KiB
    app = SmithApp()
    assert app.skill(Skill("fits", context_data=at_limit)).context_json is not None
    with pytest.raises(SkillError, match="16385 bytes serialized, over the skill_context_max_bytes limit of 16384"):
        app.skill(Skill("big", context_data={"k": "x" * (16 * 1024 - 7)}))
    assert "big" not in app.skills
    small = SmithApp(skill_context_max_bytes=10)
    with pytest.raises(SkillError, match="limit of 10"):
        small.skill(SKILLS / "research")
    with pytest.raises(SkillError, match="limit of 10"):
        load_skill(SKILLS / "research", context_max_bytes=10)


# ---- the app ----------------------------------------------------------------------------------------


def test_agents_name_registered_skills_only():
    app = SmithApp()
    app.skill(SKILLS / "research")
    assert app.agent("a", skills=["research"]).skills == ["research"]
    with pytest.raises(ConfigurationError, match="'pdf-tools' is not a registered skill"):
        app.agent("b", skills=["pdf-tools"])


def test_skill_mcp_servers_are_pooled_sources_shared_by_alias():
    app = SmithApp()
    server = {"alias": "files", "command": "files-server"}
    app.skill(Skill("one", mcp_servers=[server]))
    app.skill(Skill("two", mcp_servers=[dict(server)]))  # the same server: one pooled source
    assert list(app.sources) == ["files"]
    assert app.sources["files"].config is app.skills.get("one").servers[0]  # the first binding's config
    assert app.source("skill:missing") is None
    assert app.source("source:files") is app.sources["files"]
    with pytest.raises(ConfigurationError, match="alias 'files' is registered with another configuration"):
        app.skill(Skill("three", mcp_servers=[{"alias": "files", "command": "other"}]))
    assert "three" not in app.skills


# ---- system prompt ---------------------------------------------------------------------


def test_system_prompt_is_composed_in_order_with_empty_sections_omitted():
    first = Skill("first", system_prompt="Do A.", context_data={"a": 1})
    context_only = Skill("second", context_data=[1])
    prompt_only = Skill("third", system_prompt="Do C.")
    assert compose_system_prompt("Base.", [first, context_only, prompt_only]) == (
        "Base.\n\n# Skill: first\nDo A.\n\n# Skill Context: first\n{\"a\":1}\n\n"
        "# Skill Context: second\n[1]\n\n# Skill: third\nDo C."
    )
    assert compose_system_prompt("", [prompt_only]) == "# Skill: third\nDo C."
    assert compose_system_prompt("Base.", [Skill("empty")]) == "Base."


# ---- the active skills of a step -------------------------------------------------------------------


def step_skills(skills: list[Skill], active: list[str], defaults: list[str] | None = None):
    app = SmithApp()
    for skill in skills:
        app.skill(skill)
    spec = app.agent("a", skills=defaults or [])
    conversation = ConversationSkills(app.skills, None, "c")  # type: ignore[arg-type]
    conversation.take(spec, list(active))
    return conversation, spec


async def test_defaults_come_first_and_unserved_names_are_skipped(caplog):
    conversation, spec = step_skills([Skill("zed", system_prompt="Z."), Skill("ay", system_prompt="A.")],
                                     ["ay", "zed", "gone"], defaults=["zed"])
    assert [s.name for s in conversation.active] == ["zed", "ay"]  # defaults first; "zed" once
    assert "skill 'gone' is active in a conversation but this worker does not serve it" in caplog.text
    assert conversation.system_prompt("") == "# Skill: zed\nZ.\n\n# Skill: ay\nA."


async def test_a_resumed_step_reads_the_active_skills_once():
    import fakeredis

    from smith_client.keys import Keys

    redis = fakeredis.FakeAsyncRedis()
    keys = Keys("u")
    app = SmithApp()
    app.skill(Skill("notes", tools=[lookup]))
    spec = app.agent("a")
    await redis.rpush(keys.conversation_skills("c"), "notes")
    conversation = ConversationSkills(app.skills, keys, "c")
    await conversation.ensure(spec, redis)  # a re-run resuming at its tool calls: nothing was read yet
    assert [s.name for s in conversation.active] == ["notes"]
    await redis.delete(keys.conversation_skills("c"))
    await conversation.ensure(spec, redis)  # read already in this step: kept
    assert [s.name for s in conversation.active] == ["notes"]
