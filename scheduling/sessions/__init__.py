"""Agent sessions: who a request belongs to (identity.py), what Pointsman remembers of each session (table.py) and
which KV is worth keeping for a turn that is expected soon (warm.py). Pure: no I/O, the clock is injected. The
scorer that uses them is scheduling/plugins/scorers/agent_session.py."""
