"""The LLM world's models: loading and checking actors (:mod:`.core`), LoRA, the critics, the training
engines (plain torch or DeepSpeed, :mod:`.engines`), the embedded tiny model (:mod:`.tiny`), named
pretrained models (:mod:`.pretrained`), the supervised warm start (:mod:`.sft`) and their FLOPs
(:mod:`.flops`)."""
