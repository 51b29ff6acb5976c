"""Who may see what in the console: one rule, decided here, applied by every route.

The rule is `/recall`'s, and it fails closed:
- a member sees the channels whose current roster holds them (the read permission
  `/recall` uses when the platform says nothing else), and only while memory is on there;
- a workspace admin (Discord: Manage Server or Administrator; Slack: admin or owner) sees
  every channel of the workspaces they administer, and nothing of any other workspace;
- the operator (signed in with the console's token) sees everything.

It is computed afresh for every request ("can read now"): leaving a channel hides it at the
next page. `Visibility` is the answer; `visibility` builds it; `integrations.web.guard`
applies it to a request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from speakermem.memory.console import ConsoleReads
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope

Workspace = tuple[str, str]
"""(platform, workspace id)."""


@dataclass(frozen=True)
class Membership:
    """A platform user in one workspace, as the platform said at sign-in (and re-checks)."""

    platform: str
    workspace: str
    user_id: str
    admin: bool = False

    @property
    def key(self) -> Workspace:
        return (self.platform, self.workspace)


@dataclass(frozen=True)
class Principal:
    """Who is signed in: the operator, or a platform user with their workspaces."""

    name: str
    operator: bool = False
    platform: str | None = None
    user_id: str | None = None
    """The platform account (None for the operator)."""
    memberships: tuple[Membership, ...] = ()

    def membership(self, platform: str, workspace: str) -> Membership | None:
        for m in self.memberships:
            if m.key == (platform, workspace):
                return m
        return None

    @property
    def role(self) -> str:
        if self.operator:
            return "operator"
        return "admin" if any(m.admin for m in self.memberships) else "member"


@dataclass(frozen=True)
class Visibility:
    """What one principal may see right now."""

    principal: Principal
    channels: frozenset[Scope]
    admin_of: frozenset[Workspace]
    workspaces: tuple[Workspace, ...]
    """Workspaces the principal has any view of, sorted (the operator: every one known)."""
    off_hidden: frozenset[Scope] = field(default_factory=frozenset)
    """Channels on the member's roster hidden because memory is off there."""

    def can_read(self, scope: Scope) -> bool:
        return scope in self.channels

    def is_admin(self, platform: str, workspace: str) -> bool:
        return self.principal.operator or (platform, workspace) in self.admin_of

    def sees_workspace(self, platform: str, workspace: str) -> bool:
        return (platform, workspace) in self.workspaces

    def channels_in(self, platform: str, workspace: str) -> list[Scope]:
        return sorted(
            (s for s in self.channels if (s.platform, s.workspace) == (platform, workspace)),
            key=lambda s: s.channel,
        )

    @property
    def any_admin(self) -> bool:
        return self.principal.operator or bool(self.admin_of)


def decide(
    principal: Principal,
    *,
    all_channels: Sequence[Scope],
    known_workspaces: Iterable[Workspace],
    roster: dict[Workspace, Sequence[Scope]],
    enabled: dict[Scope, bool],
) -> Visibility:
    """The pure rule: from the store's facts (every channel, each member's roster channels,
    memory on/off) to what the principal sees. Anything unknown is not visible."""
    if principal.operator:
        workspaces = sorted(
            set(known_workspaces) | {(s.platform, s.workspace) for s in all_channels}
        )
        return Visibility(
            principal=principal,
            channels=frozenset(all_channels),
            admin_of=frozenset(workspaces),
            workspaces=tuple(workspaces),
        )
    channels: set[Scope] = set()
    hidden: set[Scope] = set()
    admin_of: set[Workspace] = set()
    for m in principal.memberships:
        if m.admin:
            admin_of.add(m.key)
            channels.update(s for s in all_channels if (s.platform, s.workspace) == m.key)
            continue
        for scope in roster.get(m.key, ()):
            if (scope.platform, scope.workspace) != m.key:
                continue  # a roster answer for another workspace is no permission here
            if enabled.get(scope, False):
                channels.add(scope)
            else:
                hidden.add(scope)
    return Visibility(
        principal=principal,
        channels=frozenset(channels),
        admin_of=frozenset(admin_of),
        workspaces=tuple(sorted({m.key for m in principal.memberships})),
        off_hidden=frozenset(hidden),
    )


async def visibility(
    reads: ConsoleReads, governance: Governance, principal: Principal
) -> Visibility:
    """Read the facts `decide` needs from the store, now, and decide."""
    if principal.operator:
        return decide(
            principal,
            all_channels=await reads.all_channels(),
            known_workspaces=await reads.workspaces(),
            roster={},
            enabled={},
        )
    roster: dict[Workspace, list[Scope]] = {}
    needs_all = any(m.admin for m in principal.memberships)
    for m in principal.memberships:
        if not m.admin:
            roster[m.key] = await reads.roster_channels(m.platform, m.workspace, m.user_id)
    candidates = [s for scopes in roster.values() for s in scopes]
    enabled = await governance.channels_enabled(candidates) if candidates else {}
    return decide(
        principal,
        all_channels=await reads.all_channels() if needs_all else [],
        known_workspaces=[],
        roster=dict(roster),
        enabled=enabled,
    )
