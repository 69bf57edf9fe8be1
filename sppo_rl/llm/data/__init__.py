"""Prompts and references: data files (:mod:`.files`), the generated arithmetic (:mod:`.arithmetic`) and
scratchpad (:mod:`.scratchpad`) tasks, and how a prompt is rendered for a model (:mod:`.prompts`)."""
