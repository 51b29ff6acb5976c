"""The shell adapter: a terminal chat on the same events, dispatcher and /recall."""
