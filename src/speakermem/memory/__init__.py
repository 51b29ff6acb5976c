"""SpeakerMem memory core: the dual-track store, the Writer and the /recall pipeline.

This package is platform-neutral: it imports no chat SDK and no vendor client.
"""
