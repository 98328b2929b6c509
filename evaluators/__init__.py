"""Which changes matter: a watch's SQL filter, its LLM judge (served or offline), and the tools
that check them (eval, explain, replay, feedback)."""
