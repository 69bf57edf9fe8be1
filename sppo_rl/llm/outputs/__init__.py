"""What a run writes besides its metrics: the exported ``final/`` folder and ``summary.json``
(:mod:`.export`), its model card (:mod:`.card`) and the logged completions (:mod:`.completions`)."""
