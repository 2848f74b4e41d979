"""What the tests share and are not tests themselves.

Helpers imported by several test modules (``cli_runner``, ``clock``, ``stand_ins``), the tools
and the worker process of the crash tests (``crash_tools``, ``crash_worker``), local servers
the clients are tested against (``llm_server``, ``mcp_server``), and the recorder of the replay
corpus (``history_scenarios``: ``python -m tests.support.history_scenarios`` or
``make histories``).
"""
