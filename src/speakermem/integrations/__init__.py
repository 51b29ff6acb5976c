"""The platform layer: Slack and Discord adapters, the CLI, the console and the composition root."""
