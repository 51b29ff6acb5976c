"""SpeakerMem: a Discord and Slack bot that remembers group conversations.

Three layers, each a subpackage, each importing only the ones below it (import-linter
checks this): `speakermem.integrations` (platforms, the CLI, the composition root) ->
`speakermem.bot` (events, dispatch, commands, settings) -> `speakermem.memory` (the store,
the Writer and the /recall pipeline).
"""

__version__ = "0.1.0"
"""The one place the version is written: the build reads it (pyproject's dynamic version)
and `speakermem --version` prints it."""
