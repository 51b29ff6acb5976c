"""The bot layer: platform-neutral events, dispatch, chat commands and settings."""
