"""The documentation's tables stay complete: ``docs/commands.md`` has a row for every command
and subcommand of ``fedsdk-server`` and ``fedsdk`` (and none for a command that is gone), and
the README's documentation table lists every ``docs/*.md`` page once."""

from __future__ import annotations

import re
from pathlib import Path

import click

from sdk_device.cli import main as device_main
from server_toolkit.cli import main as server_main

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"fedsdk-server": "## `fedsdk-server` (server)", "fedsdk": "## `fedsdk` (device)"}


def leaf_commands(group: click.Group, path: str = "") -> set[str]:
    """Every runnable command below ``group``, as ``"devices add"``."""
    found = set()
    for name, command in group.commands.items():
        if command.hidden:
            continue
        full = f"{path} {name}".strip()
        found |= leaf_commands(command, full) if isinstance(command, click.Group) else {full}
    return found


def documented_commands(program: str) -> set[str]:
    """The commands named by the first cells of the rows of ``program``'s table in
    docs/commands.md: each backticked span's leading lower-case words (``devices add --run-dir
    DIR ID…`` names ``devices add``; ``--run-dir RUN`` names none)."""
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    section = text.split(SECTIONS[program], 1)[1].split("\n## ", 1)[0]
    found = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = re.split(r"(?<!\\)\|", line)[1]  # a cell may hold an escaped \|
        for span in re.findall(r"`([^`]+)`", first_cell):
            words = []
            for word in span.split():
                if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
                    break
                words.append(word)
            if words:  # a span of options only (`--run-dir RUN`) names no command
                found.add(" ".join(words))
    return found


def test_every_command_of_both_programs_has_a_row_in_docs_commands_md():
    for program, cli in (("fedsdk-server", server_main), ("fedsdk", device_main)):
        commands, documented = leaf_commands(cli), documented_commands(program)
        assert "devices add" in commands or program == "fedsdk"  # the walk reaches subcommands
        missing, stale = sorted(commands - documented), sorted(documented - commands)
        assert not missing, f"{program}: commands without a row: {missing}"
        assert not stale, f"{program}: rows for no command: {stale}"


def test_the_readme_lists_every_docs_page_once():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"\[docs/([^\]]+\.md)\]\(docs/\1\)", table)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(set(linked)) == pages
    assert len(linked) == len(set(linked)), f"listed twice: {[p for p in set(linked) if linked.count(p) > 1]}"
