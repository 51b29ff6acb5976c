"""The README and docs/ as a newcomer follows them: the README stays short, every relative link
and anchor resolves, every `speakermem …` command shown exists with the options shown, the
benchmark pages' numbers come from their JSON, and the Slack manifest grants what the adapter
uses."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from scripts import bench_tables
from scripts.gen_reference import _anchor, commands
from speakermem.integrations.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")]
)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def test_readme_is_at_most_200_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_no_path_from_a_development_machine() -> None:
    machine = re.compile(r"/work/|/home/\w|/root\b|/Users/|/tmp/")
    found = [f"{p.relative_to(ROOT)}: {m}" for p in PAGES for m in machine.findall(p.read_text())]
    assert not found, found


# ---- links ----------------------------------------------------------------------------------


def prose(text: str) -> str:
    """The text without fenced code and code spans (links there are examples, not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc slugs)."""
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        found.add(_anchor(text))
    return found


def broken_links(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            problems.append(f"{page.relative_to(ROOT)}: {target} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.relative_to(ROOT)}: {target}: no heading #{anchor}")
    return problems


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = [p for page in PAGES for p in broken_links(page, page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_link_check_finds_a_broken_file_and_a_broken_anchor() -> None:
    page = DOCS / "index.md"
    text = "[a](guides/nowhere.md) [b](guides/admins.md#nope) [c](guides/admins.md#retention)"
    assert len(broken_links(page, text)) == 2
    assert broken_links(page, "`[x](nowhere.md)` and [ok](https://example.org/x)") == []


# ---- commands shown in the docs -------------------------------------------------------------


SHELL_OPERATORS = {"<", ">", ">>", "|", "&&", "||", ";", "2>", "&"}


def command_lines(text: str) -> Iterator[list[str]]:
    """Each shell line of a fenced block that runs `speakermem` (after VAR=value, sudo or a
    venv path), as argv after `speakermem`."""
    for block in FENCE.finditer(text):
        joined = re.sub(r"\\\n\s*", " ", block.group(0))
        for line in joined.splitlines()[1:-1]:
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] == "sudo"):
                words = words[1:]
            if words and words[0].rsplit("/", 1)[-1] == "speakermem":
                ends = [i for i, w in enumerate(words) if w in SHELL_OPERATORS]
                yield words[1 : ends[0] if ends else None]


def test_every_command_in_a_code_block_parses_with_the_real_parser() -> None:
    parser = build_parser()
    bad, seen = [], 0
    for page in PAGES:
        for argv in command_lines(page.read_text()):
            seen += 1
            try:
                parser.parse_args(argv)
            except SystemExit:
                bad.append(f"{page.relative_to(ROOT)}: speakermem {shlex.join(argv)}")
    assert seen >= 30, "the docs show fewer commands than expected: is the extraction broken?"
    assert not bad, "commands the CLI rejects:\n" + "\n".join(bad)


def known_commands() -> set[tuple[str, ...]]:
    return {tuple(name.split()) for name, _, _ in commands(build_parser())}


def unknown_inline_commands(text: str) -> list[str]:
    """`speakermem X …` in prose whose command (and subcommand, for a group) does not exist."""
    known = known_commands()
    word = re.compile(r"[a-z][a-z-]*")
    bad = []
    for span in re.findall(r"`((?:\S*/)?speakermem [^`]+)`", FENCE.sub("", text)):
        words = span.split()[1:]
        if not word.fullmatch(words[0]):
            continue  # `speakermem …`: no command named
        if (words[0],) not in known:
            bad.append(span)
            continue
        group = any(len(k) == 2 and k[0] == words[0] for k in known)
        sub = words[1] if len(words) > 1 and word.fullmatch(words[1]) else None
        if group and sub and (words[0], sub) not in known:
            bad.append(span)
    return bad


def test_every_command_named_in_the_text_exists() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: {s}" for p in PAGES for s in unknown_inline_commands(p.read_text())
    ]
    assert not bad, "\n".join(bad)


def test_the_command_checks_catch_a_command_or_option_that_does_not_exist() -> None:
    parser = build_parser()
    text = "```bash\nspeakermem forget user bob --really\nspeakermem frobnicate\n```\n"
    for argv in command_lines(text):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert unknown_inline_commands(
        "Run `speakermem frobnicate --now` or `speakermem forget all`."
    ) == [
        "speakermem frobnicate --now",
        "speakermem forget all",
    ]
    assert unknown_inline_commands("`speakermem retention set DAYS|off` and `speakermem …`") == []


# ---- the Slack manifest grants what the adapter uses ----------------------------------------

# Slack's documented bot scopes per Web API method (a method the adapter starts calling must be
# added here, with its scopes, for the test to pass).
SCOPES = {
    "auth.test": set(),
    "chat.getPermalink": set(),
    "chat.postMessage": {"chat:write"},
    "chat.postEphemeral": {"chat:write"},
    "conversations.history": {"channels:history", "groups:history"},
    "conversations.replies": {"channels:history", "groups:history"},
    "conversations.info": {"channels:read", "groups:read"},
    "conversations.members": {"channels:read", "groups:read"},
    "users.info": {"users:read"},
    "users.list": {"users:read"},
}
API_FAMILIES = (
    "admin apps auth bookmarks bots calls chat conversations dialog dnd emoji files oauth pins "
    "reactions reminders search stars team usergroups users views workflows"
).split()
EVENT_SUBSCRIPTIONS = {"message": {"message.channels", "message.groups"}}
# Events the adapter reads outside translate_event (integrations/slack/translate.py:ask_of),
# with the bot scopes Slack requires for each.
ASK_EVENTS = {"app_mention": {"app_mentions:read"}, "message.im": {"im:history"}}


def slack_methods() -> set[str]:
    source = "\n".join(
        p.read_text() for p in (ROOT / "src" / "speakermem" / "integrations" / "slack").glob("*.py")
    )
    call = re.compile(rf"client\.((?:{'|'.join(API_FAMILIES)})_[A-Za-z]+)\(")
    called = {m.replace("_", ".", 1) for m in call.findall(source)}
    named = set(re.findall(rf"\"((?:{'|'.join(API_FAMILIES)})\.[A-Za-z]+)\"", source))
    return called | {n for n in named if not n.endswith(".json")}


def slack_event_kinds() -> set[str]:
    source = (ROOT / "src" / "speakermem" / "integrations" / "slack" / "translate.py").read_text()
    kinds = set(re.findall(r'kind == "([a-z_]+)"', source))
    for group in re.findall(r"kind in \(([^)]*)\)", source):
        kinds |= set(re.findall(r'"([a-z_]+)"', group))
    return kinds


def test_slack_manifest_grants_every_scope_and_event_the_adapter_uses() -> None:
    manifest = yaml.safe_load((ROOT / "deploy" / "slack-manifest.yml").read_text())
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    methods = slack_methods()
    assert {"conversations.history", "users.list", "chat.postMessage"} <= methods
    unknown = methods - SCOPES.keys()
    assert not unknown, f"add the bot scopes of {sorted(unknown)} to SCOPES"
    needed = set().union(*(SCOPES[m] for m in methods)) | {"commands"}
    assert needed <= scopes, f"the manifest lacks scopes {sorted(needed - scopes)}"
    kinds = slack_event_kinds()
    assert {"message", "member_joined_channel", "user_change"} <= kinds
    wanted = set().union(*(EVENT_SUBSCRIPTIONS.get(k, {k}) for k in kinds))
    assert wanted <= events, f"the manifest does not subscribe to {sorted(wanted - events)}"
    source = (ROOT / "src" / "speakermem" / "integrations" / "slack" / "translate.py").read_text()
    assert 'kind == "app_mention"' in source and "is_direct(event)" in source
    assert set(ASK_EVENTS) <= events, "mentions and direct messages need their events"
    assert set().union(*ASK_EVENTS.values()) <= scopes, "and their scopes"
    app_home = manifest["features"]["app_home"]
    assert app_home["messages_tab_enabled"] and not app_home["messages_tab_read_only_enabled"]


# ---- benchmark pages read their numbers from JSON ---------------------------------------------

DATA = {
    "r.json": {
        "runs": [
            {"label": "a", "ms": {"p95": 12.34}, "sent": 10, "found": 9},
            {"label": "b", "ms": {"p95": 56.0}, "sent": 10, "found": 10, "only_b": 1},
        ],
        "by": {"x-y": {"v": 0.5}},
    }
}


def expand(text: str) -> str:
    return bench_tables.expand(text, lambda name: DATA[name], "test.md")


def test_a_table_block_repeats_its_row_for_every_item() -> None:
    page = (
        "<!-- table: r.json runs -->\n| run | p95 | lost | b |\n|---|---|---|---|\n"
        "| {label} | {ms.p95:.1f} | {sent - found} | {only_b} |\n<!-- end table -->\n"
    )
    assert expand(page) == (
        "| run | p95 | lost | b |\n|---|---|---|---|\n| a | 12.3 | 1 | - |\n| b | 56.0 | 0 | 1 |\n"
    )


def test_inline_values_aggregates_and_mappings() -> None:
    assert (
        expand('{{ r.json max(runs.ms.p95):.0f }} and {{ r.json by["x-y"].v:.2f }}')
        == "56 and 0.50"
    )
    rows = "<!-- table: r.json by -->\n| k |\n|---|\n| {_key}={v} |\n<!-- end table -->"
    assert expand(rows) == "| k |\n|---|\n| x-y=0.5 |"


def test_a_value_the_json_lacks_or_a_broken_marker_fails_the_build() -> None:
    with pytest.raises(bench_tables.BenchDataError, match="nope"):
        expand("{{ r.json runs[0].nope }}")
    with pytest.raises(bench_tables.BenchDataError):
        expand("<!-- table: r.json runs -->\n| {label} |\n<!-- end table -->")
    with pytest.raises(bench_tables.BenchDataError, match="does not exist"):
        bench_tables.loader(DOCS)("no-such-result.json")


def test_examples_in_code_are_left_as_written() -> None:
    page = "```text\n{{ r.json runs[0].nope }}\n```\n"
    assert expand(page) == page


def test_every_benchmark_page_expands_from_its_committed_json() -> None:
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        out = bench_tables.expand(page.read_text(), bench_tables.loader(page.parent), page.name)
        for fenced, text in bench_tables._fences(out):
            if not fenced:
                assert not re.search(r"\{\{\s*[\w./-]+\.json", text), page.name
                assert "<!-- table:" not in text, page.name
